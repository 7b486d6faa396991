"""04 — softmax a row in chunks, then merge: by (p, m, ℓ), by LSE, pairwise as ring attention.

Cut a row into chunks and softmax each chunk on its own: chunk k gives its local
probabilities p_k and its state (m_k, ℓ_k) — or just lse_k = m_k + log ℓ_k.  The
whole-row softmax is recovered from these alone (the sources derive all three forms):

  (p, m, ℓ)   m = max_k m_k,  ℓ = Σ_k ℓ_k·exp(m_k − m),  p = p_k · ℓ_k·exp(m_k − m)/ℓ
  LSE         lse = log Σ_k exp(lse_k),                  p = p_k · exp(lse_k − lse)
  ring        fold the chunks in one at a time with the pairwise step of ring attention,
              out ← σ(lse − lse_k)·out + σ(lse_k − lse)·out_k,  lse ← log(e^lse + e^lse_k);
              a softmax is attention with V = the identity matrix, so out_k is p_k
              placed at chunk k's positions (zeros elsewhere).

On the device the chunk states come from ``kernels.softmax.fold.chunk_states`` and are merged by
``kernels.softmax.fold.fold_tree`` along different trees — left to right (a running state),
right to left, a balanced tree, a random order and shape — and the second pass
p = exp(x − m)/ℓ uses the merged state.  The row here has an empty chunk and a chunk of
−inf values (masked positions): both are the identity (−inf, 0) and weigh nothing.

    python examples/04_chunk_merge.py          # on the GPU
    python examples/04_chunk_merge.py --sim    # on the CUDA simulator
"""

import sys

import numpy as np

import _common  # first: reads --sim and switches the simulator on before numba loads
from numba import cuda

import numba_softmax as ns
from numba_softmax import reference as R
from numba_softmax.combine import IDENTITY, combine_np, lse_np, weight_np
from numba_softmax.kernels.softmax import fold


def cut_points(n, rng):
    """Seven chunks of uneven length, one of them empty."""
    cuts = sorted(rng.choice(np.arange(1, n), size=5, replace=False).tolist())
    return cuts[:2] + [cuts[2], cuts[2]] + cuts[3:]  # a repeated cut: an empty chunk


def ring(chunks, n):
    """The ring-attention fold: (out, lse) updated pairwise, chunk by chunk."""
    out = lse = None
    lo = 0
    for p, m, l in chunks:
        hi = lo + p.shape[-1]
        out_k = np.zeros(p.shape[:-1] + (n,))
        out_k[..., lo:hi] = p  # attention with V = I: the output is p itself
        lse_k = lse_np(m, l)
        out, lse = (out_k, lse_k) if out is None else R.update_out_and_lse(out, lse, out_k, lse_k)
        lo = hi
    return out, lse


def trees(k, rng):
    """Fold programs over k leaves: (name, merges, root); merge (a, b): slot a ← a ⊕ b."""
    balanced, step = [], 1
    while step < k:
        balanced += [(a, a + step) for a in range(0, k, 2 * step) if a + step < k]
        step *= 2
    slots, random_tree = list(rng.permutation(k)), []
    while len(slots) > 1:
        i = int(rng.integers(0, len(slots) - 1))
        random_tree.append((int(slots[i]), int(slots[i + 1])))
        del slots[i + 1]
    return [
        ("left to right (running state)", [(0, i) for i in range(1, k)], 0),
        ("right to left", [(k - 1, i) for i in reversed(range(k - 1))], k - 1),
        ("balanced tree", balanced, 0),
        ("random order and tree", random_tree, int(slots[0])),
    ]


def main(argv=None):
    def options(parser):
        parser.add_argument("--n", type=int, default=None, help="row length (default 60 / 1000)")
        parser.add_argument("--rows", type=int, default=4)
        parser.add_argument("--seed", type=int, default=1)

    args = _common.parse(__doc__, options, argv)
    n = args.n or _common.pick(args, 60, 1000)
    rng = np.random.default_rng(args.seed)
    x = 4 * rng.standard_normal((args.rows, n))
    cuts = cut_points(n, rng)
    bounds = [0, *cuts, n]
    x[:, bounds[4]:bounds[5]] = -np.inf  # a masked chunk
    x32 = x.astype(np.float32)
    whole = R.softmax(x)
    lse_whole = R.logsumexp(x)
    print(f"device: {_common.device_name(args.sim)};  {args.rows} rows × {n} values, "
          f"cut at {cuts}")

    chunks = R.chunk_softmax(x, cuts)  # [(p_k, m_k, ℓ_k)], float64
    m_d, l_d = fold.chunk_states(cuda.to_device(x32), cuts)
    m_dh, l_dh = m_d.copy_to_host(), l_d.copy_to_host()
    per_chunk = []
    for k, ((p, m, l), lo, hi) in enumerate(zip(chunks, bounds[:-1], bounds[1:])):
        per_chunk.append((k, f"[{lo}, {hi})", hi - lo, float(m[0]), float(l[0]),
                          float(lse_np(m[0], l[0])), float(m_dh[0, k]), float(l_dh[0, k])))
    _common.table(
        "Each chunk on its own (row 0): host float64 and device float32 states",
        ["chunk", "range", "size", "m_k", "ℓ_k", "lse_k", "m_k device", "ℓ_k device"],
        per_chunk,
        ["d", "", "d", ".4f", ".4f", ".4f", ".4f", ".4f"],
    )

    def check(name, where, p, lse):
        p = np.asarray(p, dtype=np.float64)
        return (name, where, float(np.abs(p - whole).max()),
                float(np.abs(p.sum(axis=-1) - 1).max()),
                float(np.abs(np.asarray(lse, dtype=np.float64) - lse_whole).max()))

    def merged_lse(states, order):
        m, l = IDENTITY
        for k in order:
            m, l = combine_np(m, l, *states[k])
        return lse_np(m, l)

    row_order = range(len(chunks))
    order = rng.permutation(len(chunks)).tolist()
    mls = [(m, l) for _, m, l in chunks]
    lses = [(lse_np(m, l), np.ones_like(l)) for _, m, l in chunks]  # lse_k is the state (lse_k, 1)
    ring_p, ring_lse = ring(chunks, n)
    results = [
        check("(p, m, ℓ) merge, row order", "host fp64", R.merge_chunks(chunks),
              merged_lse(mls, row_order)),
        check(f"(p, m, ℓ) merge, order {order}", "host fp64", R.merge_chunks(chunks, order),
              merged_lse(mls, order)),
        check("LSE merge", "host fp64", R.merge_chunks_lse(chunks), merged_lse(lses, row_order)),
        check("ring: pairwise update_out_and_lse", "host fp64", ring_p, ring_lse),
    ]
    for name, merges, root in trees(len(chunks), rng):
        m_c, l_c = fold.chunk_states(cuda.to_device(x32), cuts)  # fold_tree overwrites them
        m, l = fold.fold_tree(m_c, l_c, merges, root)
        m, l = m.copy_to_host(), l.copy_to_host()
        p = weight_np(x32, m[:, None]) / l[:, None]  # the second pass, with the merged state
        results.append(check(f"fold_tree: {name}", "device fp32", p, lse_np(m, l)))
    results.append(check("whole row: ns.softmax / ns.logsumexp", "device fp32",
                         ns.softmax(x32), ns.logsumexp(x32)))
    _common.table(
        f"Merged chunks vs the whole-row softmax (max over {args.rows} rows)",
        ["merge", "where", "max |p − softmax|", "max |Σp − 1|", "max |lse − lse_ref|"],
        results,
        ["", "", ".1e", ".1e", ".1e"],
    )
    worst_host = max(r[2] for r in results if "fp64" in r[1])
    worst_dev = max(r[2] for r in results if "fp32" in r[1])
    print()
    print(f"Every merge equals the whole-row softmax: host to {worst_host:.0e}, "
          f"device (float32) to {worst_dev:.0e}")
    return 0 if worst_host < 1e-12 and worst_dev < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
