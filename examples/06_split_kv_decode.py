"""06 — decoding: one block per query row vs split-KV + merge, as the KV cache grows.

A decoder producing one token has, per (batch, head), one query row against Sk cached
keys.  The FlashAttention grid gives each query tile one block, so B·H = 32 heads make 32
blocks — a fraction of a GPU's multiprocessors — and each block walks the whole cache
alone.  Split-KV (flash-decoding) cuts the keys into Z ranges, attends to each range in
its own block, and merges the Z partial results (O_z, LSE_z) with the combiner:

    m = max_z LSE_z,   ℓ = Σ_z exp(LSE_z − m),   O = Σ_z exp(LSE_z − m)·O_z / ℓ

Both are ``numba_softmax.attention``: ``num_splits=1`` and ``num_splits=Z`` (the decode
kernel: one block per key range, the last block of a head merging the Z partials).  On a
GPU the calls are queued behind a sleeping kernel, so the CUDA events time the device
work, not Python's validation and launch overhead.  Decoding is memory-bound — K and V
are read once — so the table reports the KV-cache bandwidth (2·Sk·D·4 bytes per head /
time) beside the time.  A second table merges two halves of
the keys with ``numba_softmax.merge_attention`` — the pairwise step of ring attention —
and checks it against attention over all the keys.

    python examples/06_split_kv_decode.py          # on the GPU
    python examples/06_split_kv_decode.py --sim    # on the CUDA simulator
"""

import sys

import numpy as np

import _common  # first: reads --sim and switches the simulator on before numba loads
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.attention import attention, merge_attention
from numba_softmax.kernels.decode import decode_launch

CHECK_HEADS = 4  # heads checked against the float64 reference


def auto_splits(heads, num_sms, sk):
    """Enough blocks for about two per multiprocessor (a power of two), no split shorter
    than 64 keys, at least 2."""
    z = 1
    while z * heads < 2 * num_sms:
        z *= 2
    return max(2, min(z, sk // 64))


def main(argv=None):
    def options(parser):
        parser.add_argument("--sk", type=int, nargs="+", default=None,
                            help="KV-cache lengths (default 64 128 / 1024 … 65536)")
        parser.add_argument("--heads", type=int, default=None, help="batch·heads (default 2 / 32)")
        parser.add_argument("--dim", type=int, default=None, help="head dimension (default 8 / 128)")
        parser.add_argument("--splits", type=int, default=None,
                            help="Z for split-KV (default: about two blocks per multiprocessor)")
        parser.add_argument("--repeat", type=int, default=None, help="timed samples (median)")

    args = _common.parse(__doc__, options, argv)
    sks = args.sk or _common.pick(args, [64, 128], [1024, 4096, 16384, 65536])
    heads = args.heads or _common.pick(args, 2, 32)
    dim = args.dim or _common.pick(args, 8, 128)
    num_sms = 4 if args.sim else cuda.get_current_device().MULTIPROCESSOR_COUNT
    repeat = args.repeat or 20
    print(f"device: {_common.device_name(args.sim)};  {heads} batch·heads, one query row each, "
          f"D = {dim}, float32")

    rows = []
    merge_rows = []
    for sk in sks:
        rng = np.random.default_rng(sk)
        q_h, k_h, v_h = (rng.standard_normal(shape, dtype=np.float32)  # float32 from the start:
                         for shape in ((heads, 1, dim), (heads, sk, dim), (heads, sk, dim)))  # GiBs
        n_ref = min(heads, CHECK_HEADS)
        ref, lse_ref = R.attention(q_h[:n_ref], k_h[:n_ref], v_h[:n_ref], return_lse=True)
        z = args.splits or auto_splits(heads, num_sms, sk)
        kv_bytes = 2 * heads * sk * dim * 4
        z_real = min(z, decode_launch.MAX_SPLITS)  # the decode kernel cuts the keys into Z even ranges
        if args.sim:  # NumPy in and out on the simulator
            q, k, v = q_h, k_h, v_h
        else:
            q, k, v = (cuda.to_device(a) for a in (q_h, k_h, v_h))
            o = cuda.device_array((heads, 1, dim), np.float32)
        times = {}
        for name, splits, blocks in (("one block per query row", 1, heads),
                                     (f"split-KV, Z = {z_real}", z, heads * z_real)):
            if args.sim:  # NumPy in and out; no time (it would measure Python threads)
                got, t = attention(q, k, v, num_splits=splits), None
            else:
                def run(splits=splits):
                    attention(q, k, v, num_splits=splits, out=o)

                run()
                got = o.copy_to_host()
                t = _common.seconds(run, False, warmup=2, repeat=repeat, inner=10)
            err = float(np.abs(got[:n_ref] - ref).max())
            times[name] = t
            if t is None:
                rows.append((sk, name, blocks, err, None, None, None))
            else:
                rows.append((sk, name, blocks, err, t * 1e6, kv_bytes / t / 1e9,
                             times["one block per query row"] / t))

        # ring attention's step: attention over two halves of the keys, merged
        half = sk // 2
        halves = [(k_h[:, a:b], v_h[:, a:b]) for a, b in ((0, half), (half, sk))]
        if not args.sim:
            halves = [tuple(cuda.to_device(np.ascontiguousarray(x)) for x in pair) for pair in halves]
        (o_a, lse_a), (o_b, lse_b) = (attention(q, kk, vv, return_lse=True) for kk, vv in halves)
        o_m, lse_m = merge_attention(o_a, lse_a, o_b, lse_b)
        if not args.sim:
            o_m, lse_m = o_m.copy_to_host(), lse_m.copy_to_host()
        merge_rows.append((sk, float(np.abs(o_m[:n_ref] - ref).max()),
                           float(np.abs(lse_m[:n_ref] - lse_ref).max())))

    _common.table(
        "Decode attention (Sq = 1): time as the KV cache grows",
        ["Sk", "method", "blocks", "max |O − O_fp64|", "time µs", "KV GB/s", "speed-up"],
        rows,
        ["d", "", "d", ".1e", ".1f", ".0f", ".1f"],
    )
    _common.table(
        "merge_attention: keys [0, Sk/2) and [Sk/2, Sk) attended separately, then merged",
        ["Sk", "max |O − O_fp64|", "max |LSE − LSE_fp64|"],
        merge_rows,
        ["d", ".1e", ".1e"],
    )
    print()
    print(f"Errors over the first {CHECK_HEADS} heads, against float64 NumPy.  'blocks' is "
          f"the first kernel's grid; the device has {num_sms} multiprocessors.")
    if args.sim:
        print("On the simulator nothing is timed (a time would measure Python threads, "
              "not a GPU): time, GB/s and speed-up are blank.")
    worst = max([r[3] for r in rows] + [r[1] for r in merge_rows] + [r[2] for r in merge_rows])
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
