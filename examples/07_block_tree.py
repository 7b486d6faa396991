"""07 — one row through the fused kernel: per-thread (m, ℓ), then the block's reduction tree.

The fused kernel (v2) gives a row to one block of T threads.  Thread t loads its VPT
values as VPT/W vectors of W (16 bytes: W = 4 float32) — vector i covers the columns
(t + i·T)·W … (t + i·T)·W + W − 1, so a warp reads one contiguous stretch — and keeps
them in registers; slots past the row's end hold −inf, which weighs nothing.  Each thread
folds its values into its own state (m, ℓ) = (max, Σ exp(x − max)).
The block then folds its T states into one with the combiner, along a fixed tree
(``kernels/rows/reduce.py``):

  warp level    five ``shfl_xor_sync`` butterflies, offsets 16, 8, 4, 2, 1: lane i merges
                with lane i XOR offset.  After offset o, every lane i holds the state of
                all lanes ≡ i (mod o) — after offset 1, the whole warp's state.
  block level   lane 0 of each warp posts its state to shared memory (slots past the
                number of warps hold the identity (−inf, 0)); each warp runs the same
                butterfly over the 32 slots, and every thread ends with the row's state.

The states printed come from the device: the fused kernel's traced twin (the same source
compiled with ``trace=True``, :func:`numba_softmax.kernels.softmax.fused.kernel`) writes every
thread's (m, ℓ) after each level of the tree to a buffer.  Beside them the script
replays the tree on the host with the package's ``combine`` in float32 and says how far
each level's device states are from it; the final state is checked against the
production kernel's logsumexp and softmax and the float64 reference.

    python examples/07_block_tree.py          # on the GPU
    python examples/07_block_tree.py --sim    # on the CUDA simulator
"""

import math
import sys

import numpy as np

import _common  # first: reads --sim and switches the simulator on before numba loads
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.combine import IDENTITY, combine, lse, weight
from numba_softmax.kernels.softmax import fused
from numba_softmax.runtime import launcher
from numba_softmax.kernels.hw import vector
from numba_softmax.kernels.rows.epilogue import LOGSUMEXP, SOFTMAX

WARP = 32
F32 = np.float32


class State:
    """(m, ℓ) plus the number of row values it summarises (for the printout)."""

    def __init__(self, m, l, count):
        self.m, self.l, self.count = F32(m), F32(l), count

    def __add__(self, other):  # the combiner, in float32 like the kernel
        m, l = combine(self.m, self.l, other.m, other.l)
        return State(m, l, self.count + other.count)


def columns(t, threads, vpt, width):
    """The row columns thread t loads: VPT/W vectors of W, vector i at (t + i·T)·W."""
    return [(t + i * threads) * width + k for i in range(vpt // width) for k in range(width)]


def thread_states(x, threads, vpt, width):
    """Stage 1: thread t's values and its state, as the fused kernel forms them
    (the max first, then Σ exp(v − max) against it)."""
    n = len(x)
    out = []
    for t in range(threads):
        cols = columns(t, threads, vpt, width)
        v = [F32(x[j]) if j < n else F32(-math.inf) for j in cols]
        m = F32(-math.inf)
        for vi in v:
            m = vi if vi > m else m
        l = F32(0.0)
        for vi in v:
            l = F32(l + F32(weight(vi, m)))
        out.append(State(m, l, sum(1 for j in cols if j < n)))
    return out


def butterfly(states):
    """One warp's five shuffle levels; yields (offset, the 32 lanes' states) per level."""
    offset = WARP // 2
    while offset > 0:
        states = [states[i] + states[i ^ offset] for i in range(WARP)]  # own ⊕ partner's
        yield offset, states
        offset //= 2


class Device:
    """Every thread's (m, ℓ) after each level, written by the traced fused kernel; each
    look-up notes how far the device's state is from the host tree's (relative)."""

    def __init__(self, x_d, p_d, threads, vpt, width):
        tr = cuda.to_device(np.full((fused.TRACE_LEVELS, threads, 2), np.nan, F32))  # poisoned
        traced = fused.kernel(np.dtype(F32), vpt, SOFTMAX, width, threads, trace=True)
        launcher.launch(traced, 1, threads, 0, (x_d, p_d, tr))
        self.levels, self.worst = tr.copy_to_host(), 0.0

    def state(self, host, level, thread):
        m, l = (F32(v) for v in self.levels[level, thread])
        for a, b in ((m, host.m), (l, host.l)):
            if not (a == b or abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))):
                self.worst = max(self.worst, abs(float(a) - float(b)) / max(1.0, abs(float(b))))
            if np.isnan(a):
                self.worst = math.inf  # a level the kernel never wrote
        return State(m, l, host.count)


def show(title, rows, limit, second="lanes"):
    shown = [r[:5] for r in rows[:limit]]
    _common.table(title, ["where", second, "values", "m", "ℓ"], shown,
                  ["", "", "d", ".5f", ".6f"])
    if len(rows) > limit:
        print(f"… and {len(rows) - limit} more")


def _close(a, b):
    return a == b or abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))


def groups(warp_label, offset, states):
    """The distinct states after a level: lanes ≡ i (mod offset) agree."""
    rows = []
    for i in range(offset):
        s = states[i]
        # the lanes of a group hold one state — up to rounding on the device: lane i
        # computes combine(own, partner) and its partner combine(partner, own), and with
        # fused multiply-adds the two orders may differ in the last bit
        assert all(_close(states[j].m, s.m) and _close(states[j].l, s.l)
                   for j in range(i, WARP, offset)), f"lanes ≡ {i} (mod {offset}) disagree"
        lanes = "all 32" if offset == 1 else f"≡ {i} (mod {offset})"
        rows.append((warp_label, lanes, s.count, float(s.m), float(s.l), i))
    return rows


def main(argv=None):
    def options(parser):
        parser.add_argument("--n", type=int, default=200, help="row length (default 200)")
        parser.add_argument("--threads", type=int, default=64,
                            help="threads per block, a multiple of 32 (default 64)")
        parser.add_argument("--show", type=int, default=8, help="states shown per level")
        parser.add_argument("--seed", type=int, default=0)

    args = _common.parse(__doc__, options, argv)
    T, n = args.threads, args.n
    if T % WARP or not WARP <= T <= 1024:
        raise SystemExit("--threads must be a multiple of 32, at most 1024")
    n_warps = T // WARP
    rng = np.random.default_rng(args.seed)
    x = (3 * rng.standard_normal(n)).astype(F32)
    x_d = cuda.to_device(x[None, :])
    p_d = cuda.device_array((1, n), dtype=F32)
    width = vector.vector_width(x_d, p_d)  # what the kernel will load at a time
    vpt = max(fused.fit_vpt(n, T), width)  # as fused.launch chooses it
    print(f"device: {_common.device_name(args.sim)}")
    print(f"one row of {n} float32 values; {T} threads ({n_warps} warps) × {vpt} values per "
          f"thread, loaded {width} at a time = {T * vpt} slots, {T * vpt - n} of them "
          f"padding (−inf)")

    # the device: the traced twin of the fused kernel writes every level
    dev = Device(x_d, p_d, T, vpt, width)

    # stage 1: per-thread states (host tree beside, for the counts and the check)
    states = thread_states(x, T, vpt, width)
    rows = []
    for t, s in enumerate(states):
        s = dev.state(s, 0, t)
        cols = [j for j in columns(t, T, vpt, width) if j < n]
        held = f"x[{cols[0]}…{cols[-1]}]" if len(cols) == vpt and cols[-1] - cols[0] == vpt - 1 \
            else ("padding only" if not cols else ", ".join(map(str, cols)))
        rows.append((f"thread {t}", held, s.count, float(s.m), float(s.l)))
    idle = sum(1 for s in states if s.count == 0)
    show(f"Level 0 — each thread folds its {vpt} values: m = max, ℓ = Σ exp(v − m)"
         + (f"  ({idle} threads hold only padding: the identity)" if idle else ""), rows,
         args.show, second="holds")

    # stage 2: the butterfly inside each warp
    per_warp = [list(states[w * WARP:(w + 1) * WARP]) for w in range(n_warps)]
    levels = [butterfly(lanes) for lanes in per_warp]
    level = 1
    for steps in zip(*levels):
        rows = []
        for w, (offset, lanes) in enumerate(steps):
            lanes = [dev.state(s, level, w * WARP + i) for i, s in enumerate(lanes)]
            rows += groups(f"warp {w}", offset, lanes)
            per_warp[w] = lanes
        show(f"Level {level} — shfl_xor_sync offset {steps[0][0]}: lane i ⊕ lane i^{steps[0][0]}",
             sorted(rows, key=lambda r: (r[5], r[0]))[:len(rows)], args.show)
        level += 1

    # stage 3: across warps, through 32 shared-memory slots
    slots = [per_warp[w][0] for w in range(n_warps)] + [State(*IDENTITY, 0)] * (WARP - n_warps)
    rows = [(f"slot {i}", "from warp " + str(i) if i < n_warps else "identity", s.count,
             float(s.m), float(s.l)) for i, s in enumerate(slots)]
    show("Shared memory — lane 0 of each warp posts its warp's state; empty slots hold the "
         "identity (−inf, 0)", rows,
         max(args.show, n_warps + 1), second="holds")
    if n_warps > 1:  # one warp: the butterfly was the whole tree (no block levels)
        for offset, lanes in butterfly(slots):
            lanes = [dev.state(s, level, i) for i, s in enumerate(lanes)]  # warp 0's lanes
            show(f"Level {level} — across warps, offset {offset}",
                 groups("block", offset, lanes), args.show)
            level += 1
            slots = lanes
    final = slots[0]

    # the device: the fused kernel with the same launch, in logsumexp and softmax modes
    y = cuda.device_array((1, 1), dtype=F32)
    fused.launch(x_d, y, LOGSUMEXP, threads=T, vpt=vpt)
    lse_device = float(y.copy_to_host()[0, 0])
    fused.launch(x_d, p_d, SOFTMAX, threads=T, vpt=vpt)
    p_device = p_d.copy_to_host()[0].astype(np.float64)
    p_host = np.array([weight(v, final.m) for v in x], dtype=F32) / final.l

    m64, l64 = R.online_state(x.astype(np.float64), block=n)
    lse64 = float(R.logsumexp(x.astype(np.float64)))
    _common.table(
        "The row's state",
        ["computed by", "values", "m", "ℓ", "lse = m + log ℓ", "|lse − lse_fp64|",
         "max |p − p_fp64|"],
        [
            ("device tree above (fp32)", final.count, float(final.m), float(final.l),
             float(lse(final.m, final.l)), abs(float(lse(final.m, final.l)) - lse64),
             float(np.abs(p_host - R.softmax(x.astype(np.float64))).max())),
            ("device fused kernel (fp32)", n, None, None, lse_device, abs(lse_device - lse64),
             float(np.abs(p_device - R.softmax(x.astype(np.float64))).max())),
            ("reference (fp64)", n, float(m64), float(l64), lse64, 0.0, 0.0),
        ],
        ["", "d", ".5f", ".6f", ".7f", ".1e", ".1e"],
    )
    gap = abs(lse_device - float(lse(final.m, final.l)))
    ok = final.count == n and gap < 1e-5 * max(1, abs(lse64)) and dev.worst <= 1e-5
    print()
    print(f"The tree saw every value once ({final.count} of {n}).  Every level printed was "
          f"written by the device; the host replay of the tree matches it to {dev.worst:.1e} "
          f"(relative), and the production kernel's lse matches the traced tree's to {gap:.1e}.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
