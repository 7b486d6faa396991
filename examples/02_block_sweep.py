"""02 — the block-size sweep: online softmax equals the full-row softmax for every block size.

Online softmax streams a row in blocks of B values and keeps only a running state
(m, ℓ): the max so far and Σ exp(x − m) so far.  Each block is reduced to its own state
and merged in with the combiner

    m_new = max(m, m_blk),   ℓ_new = ℓ·exp(m − m_new) + ℓ_blk·exp(m_blk − m_new);

a second pass writes p = exp(x − m)/ℓ.  The sources run this sweep in C for B = 1 … 1024
on a 1024-value row and find the online result within float32 round-off (~1e-7) of the
full-batch ("naive", three-pass) softmax at every B.  Here it runs on the device:

  table 1  ``kernels.softmax.fold.chunk_states`` makes the state of every block of B values (one
           thread per block), ``kernels.softmax.fold.fold_tree`` folds the states left to right —
           the running state — and a small kernel below does the second pass;
  table 2  the package's online kernel (v3), whose chunk is C = threads × values per
           thread, for C = 128 … 1024.

Both are compared with the three-pass kernel (v1) on the same float32 rows.

    python examples/02_block_sweep.py          # on the GPU
    python examples/02_block_sweep.py --sim    # on the CUDA simulator
"""

import sys

import numpy as np

import _common  # first: reads --sim and switches the simulator on before numba loads
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.combine import weight_device
from numba_softmax.kernels.softmax import fold, online, three_pass
from numba_softmax.kernels.rows.epilogue import SOFTMAX

BLOCKS = (1, 2, 8, 32, 128, 512, 1024)


@cuda.jit
def normalise(x, m, l, y):
    """Pass 2 of online softmax: y = exp(x − m)/ℓ with the row's final state.
    One block per row, its threads striding over the row."""
    r = cuda.blockIdx.x
    for j in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        y[r, j] = weight_device(x[r, j], m[r]) / l[r]


def online_by_blocks(x_d, block):
    """Online softmax on the device with blocks of ``block`` consecutive values."""
    n = x_d.shape[1]
    cuts = list(range(block, n, block))
    m_c, l_c = fold.chunk_states(x_d, cuts)  # the state of every block
    running = [(0, k) for k in range(1, len(cuts) + 1)]  # slot 0 ← combine(slot 0, block k)
    m, l = fold.fold_tree(m_c, l_c, running, 0)
    y = cuda.device_array_like(x_d)
    normalise[x_d.shape[0], 32](x_d, m, l, y)
    return y.copy_to_host(), m.copy_to_host(), l.copy_to_host(), len(cuts) + 1


def main(argv=None):
    def options(parser):
        parser.add_argument("--n", type=int, default=1024, help="row length (default 1024)")
        parser.add_argument("--rows", type=int, default=None, help="rows (default 2 / 8)")
        parser.add_argument("--seed", type=int, default=0)

    args = _common.parse(__doc__, options, argv)
    args.rows = args.rows or _common.pick(args, 2, 8)
    rng = np.random.default_rng(args.seed)
    x = (3 * rng.standard_normal((args.rows, args.n))).astype(np.float32)
    x_d = cuda.to_device(x)

    naive = cuda.device_array_like(x_d)  # the full-batch softmax, three passes, fp32
    three_pass.launch(x_d, naive, SOFTMAX, threads=32)
    naive = naive.copy_to_host().astype(np.float64)
    m_ref, l_ref = R.online_state(x.astype(np.float64), block=args.n)  # exact (fp64)

    print(f"device: {_common.device_name(args.sim)};  {args.rows} rows × {args.n} float32 values")
    rows = []
    for b in BLOCKS:
        if b > args.n:
            continue
        p, m, l, chunks = online_by_blocks(x_d, b)
        rows.append((
            b, chunks,
            float(np.abs(p - naive).max()),
            float(p[0].astype(np.float64).sum()),
            float(np.abs(p.astype(np.float64).sum(axis=1) - 1).max()),
            "yes" if np.array_equal(m, m_ref.astype(np.float32)) else "NO",
            float(np.abs(l / l_ref - 1).max()),
        ))
    _common.table(
        f"Online (streaming) softmax on the device, block-size sweep, N = {args.n} "
        f"(max over {args.rows} rows)",
        ["block B", "blocks", "max |online − naive|", "Σp (row 0)", "max |Σp − 1|",
         "m exact", "max |ℓ/ℓ_fp64 − 1|"],
        rows,
        ["d", "d", ".2e", ".6f", ".1e", "", ".1e"],
    )

    rows2 = []
    for chunk in (128, 256, 512, 1024):  # vpt a multiple of 4: whole 16-byte vectors
        if chunk > args.n:
            continue
        threads = 32
        vpt = chunk // threads
        y = cuda.device_array_like(x_d)
        online.launch(x_d, y, SOFTMAX, threads=threads, vpt=vpt)
        p = y.copy_to_host().astype(np.float64)
        rows2.append((chunk, f"{threads} × {vpt}", float(np.abs(p - naive).max()),
                      float(p[0].sum()), float(np.abs(p.sum(axis=1) - 1).max())))
    _common.table(
        "The online kernel (v3): chunk C = threads × values per thread",
        ["chunk C", "threads × vpt", "max |online − naive|", "Σp (row 0)", "max |Σp − 1|"],
        rows2,
        ["d", "", ".2e", ".6f", ".1e"],
    )

    worst = max(r[2] for r in rows + rows2)
    print()
    print(f"Largest difference from the full-row softmax at any block size: {worst:.1e} "
          f"(float32 round-off is ~6e-8 per operation)")
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
