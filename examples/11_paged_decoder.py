"""11 — a toy decoder loop over a paged KV cache, checked against dense attention each step.

Serving engines keep each sequence's keys and values in fixed-size *blocks* of a shared
cache, named by a per-sequence *block table*, so that sequences can grow without moving
memory (PagedAttention; flash-attn's ``flash_attn_with_kvcache`` layout):

    k_cache, v_cache   (num_blocks, block_size, Hkv, D)   one pool for every sequence
    block_table        (B, max_blocks_per_seq) int32      sequence b's blocks, in order
    cache_seqlens      (B,) int32                         tokens held so far

Each step of the loop, for B sequences of different lengths:

    1. append_kv       the step's new key/value token goes into its block
    2. cache_seqlens  += 1
    3. paged_attention the new query token attends to every cached token of its sequence,
                       keys split over ranges merged by log-sum-exp (flash-decoding),
                       GQA: each K/V head read once for its group of query heads

The blocks are handed out shuffled from the pool (as an allocator would after frees), and
every step's output is compared with dense attention over the same tokens gathered in
order (float64 NumPy), then with ``ns.attention`` on the gathered keys.

    python examples/11_paged_decoder.py          # on the GPU
    python examples/11_paged_decoder.py --sim    # on the CUDA simulator
"""

import sys

import numpy as np

import _common  # first: reads --sim and switches the simulator on before numba loads
from numba import cuda

import numba_softmax as ns
from numba_softmax.reference import paged as RP


def main(argv=None):
    def options(parser):
        parser.add_argument("--steps", type=int, default=None, help="tokens to decode")

    args = _common.parse(__doc__, options, argv)
    steps = args.steps or _common.pick(args, 4, 64)
    b, hq, hkv, d, block = 3, _common.pick(args, 4, 32), _common.pick(args, 2, 8), \
        _common.pick(args, 16, 128), _common.pick(args, 4, 16)
    prompt = np.array(_common.pick(args, [5, 1, 9], [300, 17, 1000]), np.int32)
    rng = np.random.default_rng(0)
    per_seq = -(-(int(prompt.max()) + steps) // block)
    pool = b * per_seq + 3
    table = rng.permutation(pool)[: b * per_seq].reshape(b, per_seq).astype(np.int32)
    print(f"device: {_common.device_name(args.sim)};  B = {b}, Hq = {hq}, Hkv = {hkv}, D = {d}, "
          f"block_size = {block}, {pool} blocks in the pool")

    # the prompt's keys and values, written through the table, then one token per step
    k_host = np.zeros((pool, block, hkv, d), np.float32)
    v_host = np.zeros_like(k_host)
    lengths = np.zeros(b, np.int32)
    k_cache, v_cache = cuda.to_device(k_host), cuda.to_device(v_host)
    table_d = cuda.to_device(table)
    k_prompt = rng.standard_normal((b, int(prompt.max()), hkv, d)).astype(np.float32)
    v_prompt = rng.standard_normal(k_prompt.shape).astype(np.float32)
    for pos in range(int(prompt.max())):  # the prompts, one position at a time
        grow = (prompt > pos).astype(np.int32)
        for i in np.flatnonzero(grow):
            k_host, v_host = RP.append_kv(k_host, v_host, table[i:i + 1], lengths[i:i + 1],
                                          k_prompt[i:i + 1, pos:pos + 1], v_prompt[i:i + 1, pos:pos + 1])
        lengths += grow
    k_cache.copy_to_device(k_host)
    v_cache.copy_to_device(v_host)

    rows, worst = [], 0.0
    for step in range(steps):
        k_new = rng.standard_normal((b, 1, hkv, d)).astype(np.float32)
        v_new = rng.standard_normal((b, 1, hkv, d)).astype(np.float32)
        ns.append_kv(cuda.to_device(k_new), cuda.to_device(v_new), k_cache, v_cache, table_d,
                     cuda.to_device(lengths))
        k_host, v_host = RP.append_kv(k_host, v_host, table, lengths, k_new, v_new)
        lengths = lengths + 1
        q = rng.standard_normal((b, hq, 1, d)).astype(np.float32)
        o = ns.paged_attention(cuda.to_device(q), k_cache, v_cache, table_d,
                               cuda.to_device(lengths)).copy_to_host()
        want = RP.paged_attention(q, k_host, v_host, table, lengths)
        err = float(np.abs(o - want).max())
        dense = max(float(np.abs(ns.attention(q[i:i + 1], RP.gather_kv(k_host, table, i, int(lengths[i]))
                                              .transpose(1, 0, 2)[None],
                                              RP.gather_kv(v_host, table, i, int(lengths[i]))
                                              .transpose(1, 0, 2)[None]) - o[i:i + 1]).max())
                    for i in range(b))
        worst = max(worst, err, dense)
        if step < 4 or step == steps - 1:
            rows.append((step, " ".join(str(n) for n in lengths), err, dense))
    caches_equal = np.array_equal(k_cache.copy_to_host(), k_host) and \
        np.array_equal(v_cache.copy_to_host(), v_host)
    _common.table("Decode steps: paged attention of one new token per sequence",
                  ["step", "cache_seqlens", "max |O − O_fp64|", "max |O − ns.attention dense|"],
                  rows, ["d", "", ".1e", ".1e"])
    print(f"\nThe caches written by append_kv equal the NumPy twin's: {'yes' if caches_equal else 'NO'}")
    return 0 if caches_equal and worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
