"""05 — materialised vs single-pass (Flash) attention: error, device memory, time, as S grows.

    O = softmax(scale · Q Kᵀ) V,   Q, K, V: (heads, S, D)

Materialised (a STRAWMAN written below, not in the package): one kernel writes the
S×S score matrix to device memory, the package's softmax turns it into P (another S×S
matrix), a third kernel computes P V.  Memory grows as S², and every score is written and
read twice.

Single pass (``numba_softmax.attention``, FlashAttention): each block keeps the state
(m, ℓ, O) of a tile of query rows on chip and streams the key/value tiles past it; the
score matrix never exists.  Memory grows as S (Q, K, V, O and one LSE per row).

The table: the largest error of each against a float64 reference (on a sample of query
rows), the device memory each one holds — counted from its buffers, and measured from
the driver's free-memory figure on a GPU — and the median time.  Sizes whose S² buffers
would exceed ``--max-gib`` are skipped for the materialised version: that is the wall
the single-pass version does not have.

    python examples/05_flash_attention.py          # on the GPU
    python examples/05_flash_attention.py --sim    # on the CUDA simulator
"""

import math
import sys

import numpy as np

import _common  # first: reads --sim and switches the simulator on before numba loads
from numba import cuda, float32

import numba_softmax as ns
from numba_softmax import reference as R
from numba_softmax.attention import attention

SAMPLE_ROWS = 64  # query rows checked against the float64 reference


# --- the strawman: scores and probabilities in device memory -----------------------------
@cuda.jit
def scores(q, k, s, scale):
    """s[h, i, j] = scale · q[h, i] · k[h, j]: one thread per score."""
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < s.shape[1] and j < s.shape[2]:
        acc = float32(0.0)
        for d in range(q.shape[2]):
            acc += q[h, i, d] * k[h, j, d]
        s[h, i, j] = acc * float32(scale)


@cuda.jit
def weighted_sum(p, v, o):
    """o[h, i, c] = Σ_j p[h, i, j] · v[h, j, c]: one thread per output value."""
    c, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < o.shape[1] and c < o.shape[2]:
        acc = float32(0.0)
        for j in range(p.shape[2]):
            acc += p[h, i, j] * v[h, j, c]
        o[h, i, c] = acc


def materialised(q, k, v, s, p, o, scale, block):
    """STRAWMAN: S = scale·Q Kᵀ → P = softmax(S) → O = P V, with S and P in device memory."""
    heads, sq, sk, dv = q.shape[0], q.shape[1], k.shape[1], v.shape[2]
    scores[(-(-sk // block[0]), -(-sq // block[1]), heads), block](q, k, s, scale)
    ns.softmax(s, out=p)  # the package's softmax, on the S×S matrix
    weighted_sum[(-(-dv // block[0]), -(-sq // block[1]), heads), block](p, v, o)


# --- measuring memory ---------------------------------------------------------------------
def free_bytes(sim):
    """Free device memory after pending frees are flushed; None on the simulator."""
    if sim:
        return None
    ctx = cuda.current_context()
    ctx.deallocations.clear()
    return ctx.get_memory_info().free


def used_since(free0, sim):
    """The drop in free device memory since ``free0`` (None on the simulator)."""
    return None if free0 is None else _common.nbytes(free0 - free_bytes(sim))


# --- the two contestants ----------------------------------------------------------------
def run_materialised(q_h, k_h, v_h, ref, args, block, scale):
    """(max error, measured memory, seconds) of the strawman."""
    heads, S, dim = q_h.shape
    free0 = free_bytes(args.sim)
    q, k, v = (cuda.to_device(a) for a in (q_h, k_h, v_h))
    s = cuda.device_array((heads, S, S), np.float32)
    p = cuda.device_array((heads, S, S), np.float32)
    o = cuda.device_array((heads, S, dim), np.float32)

    def run():
        materialised(q, k, v, s, p, o, scale, block)

    run()
    err = float(np.abs(o.copy_to_host()[:, :len(ref[0])] - ref).max())
    measured = used_since(free0, args.sim)  # while S, P and the rest are alive
    return err, measured, _common.seconds(run, args.sim, warmup=1, repeat=args.repeat)


def run_single_pass(q_h, k_h, v_h, ref, args):
    """(max error, measured memory, seconds) of ``numba_softmax.attention``."""
    free0 = free_bytes(args.sim)
    if args.sim:  # NumPy in and out on the simulator; no time (Python threads)
        o = attention(q_h, k_h, v_h)
        return float(np.abs(o[:, :len(ref[0])] - ref).max()), None, None
    q, k, v = (cuda.to_device(a) for a in (q_h, k_h, v_h))
    o = cuda.device_array(q_h.shape[:2] + v_h.shape[2:], np.float32)

    def run():
        attention(q, k, v, out=o)

    run()
    err = float(np.abs(o.copy_to_host()[:, :len(ref[0])] - ref).max())
    measured = used_since(free0, False)
    return err, measured, _common.seconds(run, False, warmup=1, repeat=args.repeat)


def _ms(t):
    return None if t is None else t * 1e3


def main(argv=None):
    def options(parser):
        parser.add_argument("--seq", type=int, nargs="+", default=None,
                            help="sequence lengths S (default 16 32 / 1024 … 32768)")
        parser.add_argument("--heads", type=int, default=None, help="heads (default 1 / 4)")
        parser.add_argument("--dim", type=int, default=None, help="head dimension D (default 8 / 64)")
        parser.add_argument("--max-gib", type=float, default=16.0,
                            help="skip the materialised version above this much S² memory")
        parser.add_argument("--repeat", type=int, default=None, help="timed samples (median)")

    args = _common.parse(__doc__, options, argv)
    seqs = args.seq or _common.pick(args, [16, 32], [1024, 2048, 4096, 8192, 16384, 32768])
    heads = args.heads or _common.pick(args, 1, 4)
    dim = args.dim or _common.pick(args, 8, 64)
    args.repeat = args.repeat or 5
    block = (32, 1) if args.sim else (32, 8)
    scale = 1.0 / math.sqrt(dim)
    print(f"device: {_common.device_name(args.sim)};  {heads} heads, D = {dim}, float32, "
          f"not causal")

    rows = []
    for S in seqs:
        rng = np.random.default_rng(S)
        q_h, k_h, v_h = (rng.standard_normal((heads, S, dim)).astype(np.float32) for _ in range(3))
        ref = R.attention(q_h[:, :SAMPLE_ROWS], k_h, v_h)  # query rows are independent
        io_bytes = 4 * q_h.nbytes  # Q, K, V and O
        s_bytes = heads * S * S * 4  # one S×S matrix

        model = _common.nbytes(io_bytes + 2 * s_bytes)
        if 2 * s_bytes > args.max_gib * 2**30:
            rows.append((S, "materialised", None, model, None, None,
                         f"skipped: S and P need {_common.nbytes(2 * s_bytes)}"))
        else:
            err, measured, t = run_materialised(q_h, k_h, v_h, ref, args, block, scale)
            rows.append((S, "materialised", err, model, measured, _ms(t), ""))

        err, measured, t = run_single_pass(q_h, k_h, v_h, ref, args)
        flops = 4 * heads * S * S * dim
        rows.append((S, "single pass (flash)", err, _common.nbytes(io_bytes + heads * S * 4),
                     measured, _ms(t), "" if t is None else f"{flops / t / 1e12:.2f} TFLOP/s"))

    _common.table(
        f"Attention, {heads} heads × S × D = {dim}: materialised vs single pass",
        ["S", "method", "max |O − O_fp64|", "device memory (buffers)", "measured", "time ms",
         "note"],
        rows,
        ["d", "", ".1e", "", "", ".3f", ""],
    )
    print()
    print(f"Errors are over the first {SAMPLE_ROWS} query rows, against float64 NumPy. "
          "'measured' is the drop in the driver's free memory (allocation granularity "
          "included); it and the times are blank on the simulator (a time there would "
          "measure Python threads).")
    worst = max(r[2] for r in rows if r[2] is not None)
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
