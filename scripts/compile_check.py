#!/usr/bin/env python
"""Compile every kernel the package can launch, without a GPU: one line a kernel with
ptxas's registers, spills and static shared memory — or the error — and exit status 1 if
any kernel failed to compile.

The CUDA simulator (the test suite in CI) never compiles a kernel, so what only the real
compiler finds — a typing error on a path taken only on a GPU, a link error ("Linking
globals named '_cudapy_smem_1': symbol multiply defined"), too much static shared memory,
a spill — used to wait for a GPU.  This finds it in minutes on any machine with
numba-cuda's NVVM (pip install "numba-cuda[cu13]") and a ``ptxas`` on the PATH (183
entries: 4 minutes on 2 cores):

    python scripts/compile_check.py                        # every kernel, this tree
    python scripts/compile_check.py --only topk --only decode   # names containing either
    python scripts/compile_check.py --list                 # the table, nothing compiled
    python scripts/compile_check.py --strided-16           # + 16-bit kernels at width 1
    python scripts/compile_check.py --cc 8.0               # for an A100 (no clusters)
    mkdir -p /tmp/main && git archive main numba_softmax | tar -x -C /tmp/main
    python scripts/compile_check.py --compare /tmp/main    # both trees, side by side
    python scripts/compile_check.py --root /tmp/main       # the other tree alone

:data:`TABLE` holds the entries: a kernel factory of ``numba_softmax`` (every
``jit.kernel`` of the package: :mod:`numba_softmax.kernels` and the benchmark's three),
its arguments, and the Numba types of the arguments its launch site passes
(``launcher.launch(kernel, grid, block, stream, args)``: new buffers and views of
contiguous arrays are C-contiguous, strided views "A", Python ints int64, floats float64,
NumPy scalars their own type) — in the configurations the package's ``choose`` and
``configure`` functions pick on an H100 (132 multiprocessors, 1024 threads, 227 KB of
shared memory a block) for typical shapes; float32, float16 and bfloat16 (uint16 bits)
where a kernel takes them, float64 where it does.  Each is compiled as
``scripts/ptxinfo.py`` compiles one: ``cuda.compile_ptx`` for sm_90 with the kernel's
own fastmath and launch bounds, then ``ptxas -arch=sm_90 -v`` (relocatable, ``-c``, for
a cooperative kernel: its registers are then its own).  One change to the PTX: its
shared arrays are declared in the order Numba made them (:func:`canonical`), not in
NVVM's link order, which changes from run to run and moves the register count of
kernels whose shared arrays come from several device functions (``--as-linked``: as
NVVM wrote it).

Entries run in a pool of worker processes (``--jobs``, default ``os.cpu_count()``), each
importing the package once from ``--root`` (default: this checkout) and compiling the
entries it is sent one at a time; an entry that raises is a failure of that entry only,
and a worker that dies or passes ``--timeout`` fails its entry and is replaced.  The table
prints in its own order as entries finish: registers (``c``: compiled relocatable),
spill stores (bytes; stores/loads where they differ), static shared memory (bytes),
``thr`` — the most threads a block of the compiled kernel can launch (64K registers a
block, launch bounds; ``<`` where that is fewer than the block the package launches it
with, which its ``configure`` then lowers) — and seconds to compile.  Failures are
printed in full at the end, with the entry in ptxinfo's form.  ``--compare OTHER``
compiles the same entries from a second tree and prints this tree's numbers / the
other's (a factory the other tree lacks, or whose arguments it does not take, is
``n/a``: the table follows this tree); only this tree's failures set the exit status.
``--ptx-dir DIR`` keeps each entry's PTX and ptxas report; ``--verbose`` prints each
entry's ptxinfo command line.
"""

import argparse
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import NamedTuple

if __name__ == "__main__":  # (the real compiler, whatever the caller's environment says)
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
import numpy as np  # noqa: E402
from numba.cuda.types import (Array, Tuple, UniTuple, boolean, float16, float32,  # noqa: E402
                              float64, int32, int64, uint16, uint32, uint64)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# the target: sm_90 (H100, H200) unless NUMBA_SOFTMAX_CHECK_CC (or --cc) names another,
# e.g. 8.0 (A100) or 8.9 (Ada): entries that need a newer one (clusters) are left out
CC = tuple(int(x) for x in os.environ.get("NUMBA_SOFTMAX_CHECK_CC", "9.0").split("."))
REGISTERS_PER_BLOCK = 64 * 1024


# --- the table ---------------------------------------------------------------------------
class Ref(NamedTuple):
    """An argument that is another factory's result, made in the worker:
    ``Ref("kernels.topk.topk_merge:row_merger", (np.float32, 16, 256, False))``."""

    target: str
    args: tuple


class Entry(NamedTuple):
    name: str  # the kernel, e.g. "fused"
    config: str  # the configuration: dtype, shape it is picked for, factory arguments
    target: str  # "module:factory" under numba_softmax; "a|b": the first that exists
    args: tuple  # the factory's arguments (Ref: another factory's result)
    sig: tuple  # the Numba types of the launch's arguments
    pick: object = 0  # which kernel of a tuple or dict the factory returns
    block: int = 0  # threads a block at launch (0: not fixed by the entry)
    min_cc: tuple = (8, 0)  # the oldest target it compiles for (clusters: sm_90)
    arch: str = ""  # "a": the arch-specific target (sm_90a: wgmma, setmaxnreg)

    @property
    def key(self):
        return f"{self.name} {self.config}"


def C(t, ndim):
    """A C-contiguous array of ``t`` (what a new buffer, or a view of a contiguous user
    array, types as)."""
    return Array(t, ndim, "C")


def A(t, ndim):
    """An any-layout array of ``t`` (a strided view of a user's array)."""
    return Array(t, ndim, "A")


NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "f64": np.float64}
ST = {"f32": float32, "f16": float16, "bf16": uint16, "f64": float64}  # storage types
ACC = {"f32": float32, "f16": float32, "bf16": float32, "f64": float64}  # accumulators
W16 = {"f32": 4, "f16": 8, "bf16": 8, "f64": 2}  # values a 16-byte vector
SOFTMAX, LOG_SOFTMAX, LOGSUMEXP = 0, 1, 2
MODE = {SOFTMAX: "", LOG_SOFTMAX: " log_softmax", LOGSUMEXP: " logsumexp"}
HALF = ("f16", "bf16")


def _softmax():
    """The row kernels of kernels.softmax.methods (v1–v7): x, y (rows, n) of the storage dtype;
    y is (rows, 1) for logsumexp.  Shapes are those of scripts/experiments/softmax_ab.py."""
    out = []

    def rows(d, layout=C):
        return layout(ST[d], 2), layout(ST[d], 2)

    def bits(d):  # float16 / bfloat16 rows held in pairs: the kernel takes their uint16 bits
        return C(uint16, 2), C(uint16, 2)

    # fused (v2): team·vpt hold the row; configure: the smallest team at max_vpt (32 a
    # thread up to 512 threads, 16 beyond; float64 half), the fewest values that hold it
    # (float32 softmax rows of 2049 … 12288 values: a wide team, fused.wide_team);
    # 16-bit rows of 16-byte vectors held two to a register (pairs), as uint16 bits
    F = "kernels.softmax.fused:kernel"
    for d in ("f32", "f16", "bf16"):
        out.append(Entry("fused", f"{d} 16384x1024 team32 vpt32", F,
                         (NP[d], 32, SOFTMAX, W16[d], 32), bits(d) if d in HALF else rows(d),
                         block=32))
    out += [
        Entry("fused", "f32 4096x8192 team512 vpt16 wide (40 registers)", F,
              (NP["f32"], 16, SOFTMAX, 4, 512, False, True, 40), rows("f32"), block=512),
        Entry("fused", "f32 8192x4096 team512 vpt8 wide (32 registers)", F,
              (NP["f32"], 8, SOFTMAX, 4, 512, False, True, 32), rows("f32"), block=512),
        Entry("fused", "f32 x12000 team768 vpt16 wide (40 registers)", F,
              (NP["f32"], 16, SOFTMAX, 4, 768, False, True, 40), rows("f32"), block=768),
        Entry("fused", "f32 x8192 team256 vpt32 log_softmax", F, (NP["f32"], 32, LOG_SOFTMAX, 4, 256),
              rows("f32"), block=256),
        Entry("fused", "f16 4096x8192 team256 vpt32 pairs", F, (NP["f16"], 32, SOFTMAX, 8, 256),
              bits("f16"), block=256),
        Entry("fused", "f16 2048x16384 team512 vpt32 pairs", F, (NP["f16"], 32, SOFTMAX, 8, 512),
              bits("f16"), block=512),
        Entry("fused", "bf16 2048x16384 team512 vpt32 pairs", F, (NP["bf16"], 32, SOFTMAX, 8, 512),
              bits("bf16"), block=512),
        Entry("fused", "f16 2048x16384 team512 vpt32 one a register", F,
              (NP["f16"], 32, SOFTMAX, 8, 512, False, False), rows("f16"), block=512),
        Entry("fused", "f16 x1000 team32 vpt32 W1 logsumexp", F,
              (NP["f16"], 32, LOGSUMEXP, 1, 32), rows("f16"), block=32),
        Entry("fused", "f32 team1024 vpt16", F, (NP["f32"], 16, SOFTMAX, 4, 1024), rows("f32"),
              block=1024),
        Entry("fused", "f64 x1024 team64 vpt16", F, (NP["f64"], 16, SOFTMAX, 2, 64), rows("f64"),
              block=64),
        Entry("fused", "f32 x128 team32 vpt4", F, (NP["f32"], 4, SOFTMAX, 4, 32), rows("f32"),
              block=32),
        Entry("fused", "f32 x1024 team32 vpt32 log_softmax", F, (NP["f32"], 32, LOG_SOFTMAX, 4, 32),
              rows("f32"), block=32),
        Entry("fused", "f32 x1024 team32 vpt32 logsumexp", F, (NP["f32"], 32, LOGSUMEXP, 4, 32),
              rows("f32"), block=32),
        Entry("fused", "f32 x1024 strided W1 (A)", F, (NP["f32"], 32, SOFTMAX, 1, 32),
              rows("f32", A), block=32),
        Entry("fused", "f32 x1024 padded rows W4 (A)", F, (NP["f32"], 32, SOFTMAX, 4, 32),
              rows("f32", A), block=32),
        Entry("fused", "f32 traced team64 vpt4 (example 07)", F,
              (NP["f32"], 4, SOFTMAX, 4, 64, True), rows("f32") + (C(float32, 3),), block=64),
    ]
    # online (v1's and v3's chunks: VECTORS = 2 vectors a thread); team: a runtime int64
    for name, target in (("online", "kernels.softmax.online:kernel"), ("three_pass", "kernels.softmax.three_pass:kernel")):
        for d in ("f32", "f16", "bf16", "f64"):
            out.append(Entry(name, f"{d} vpt{2 * W16[d]}", target,
                             (NP[d], 2 * W16[d], SOFTMAX, W16[d]), rows(d) + (int64,)))
        for mode in (LOG_SOFTMAX, LOGSUMEXP) if name == "online" else (LOGSUMEXP,):
            out.append(Entry(name, f"f32 vpt8{MODE[mode]}", target, (NP["f32"], 8, mode, 4),
                             rows("f32") + (int64,)))
        out.append(Entry(name, "f32 strided W1 (A)", target, (NP["f32"], 8, SOFTMAX, 1),
                         rows("f32", A) + (int64,)))
    # split (v4): piece_states(x, piece, m_ws, l_ws), normalise(x, piece, m_ws, l_ws, y);
    # the workspace in the accumulator's dtype
    S = "kernels.softmax.split:kernels"
    for d in ("f32", "f16", "bf16", "f64"):
        ws = C(ACC[d], 2)
        a = (NP[d], 2 * W16[d], SOFTMAX, W16[d])
        out.append(Entry("split.piece_states", d, S, a, (ST[d][:, ::1], int64, ws, ws), pick=0,
                         block=256))
        out.append(Entry("split.normalise", d, S, a, (ST[d][:, ::1], int64, ws, ws, ST[d][:, ::1]),
                         pick=1, block=256))
    out.append(Entry("split.normalise", "f32 logsumexp", S, (NP["f32"], 8, LOGSUMEXP, 4),
                     (float32[:, ::1], int64, C(float32, 2), C(float32, 2), float32[:, ::1]),
                     pick=1, block=256))
    # onchip (v5): a block of 512 per row; stride: runtime
    O = "kernels.softmax.onchip:kernel"
    for d in ("f32", "f16", "bf16", "f64"):
        out.append(Entry("onchip", f"{d} 512 threads", O, (NP[d], 2 * W16[d], SOFTMAX, W16[d], 512),
                         rows(d) + (int64,), block=512))
    for mode in (LOG_SOFTMAX, LOGSUMEXP):
        out.append(Entry("onchip", f"f32 512 threads{MODE[mode]}", O, (NP["f32"], 8, mode, 4, 512),
                         rows("f32") + (int64,), block=512))
    # group (v6, cooperative): x, y, size, piece, spill, stride, m_ws, l_ws, counters
    G = "kernels.softmax.group:kernel"
    for d, spills in (("f32", True), ("f32", False), ("f16", True), ("f16", False),
                      ("bf16", True), ("f64", True)):
        ws = C(ACC[d], 2)
        out.append(Entry("group", f"{d} 256 threads{' spills' if spills else ''}", G,
                         (NP[d], 2 * W16[d], SOFTMAX, W16[d], 256, spills),
                         rows(d) + (int64, int64, int64, int64, ws, ws, C(int64, 1)), block=256))
    out.append(Entry("group", "f32 256 threads spills logsumexp", G, (NP["f32"], 8, LOGSUMEXP, 4, 256, True),
                     rows("f32") + (int64, int64, int64, int64, C(float32, 2), C(float32, 2), C(int64, 1)),
                     block=256))
    # cluster (v7): x, y, piece, stride; pieces of 32 KB in shared memory, or in registers
    K = "kernels.softmax.cluster:kernel"
    for d, a, cfg in (
            ("f32", (8, SOFTMAX, 4, 256, 8), "1024x65536 8x256 shared"),
            ("f16", (16, LOGSUMEXP, 8, 256, 4), "1024x65536 4x256 logsumexp"),
            ("f64", (4, SOFTMAX, 2, 512, 8), "1024x65536 8x512 shared"),
            ("f32", (32, SOFTMAX, 4, 1024, 8, True), "256x262144 8x1024 registers"),
            ("f32", (32, SOFTMAX, 4, 1024, 2, True), "1024x65536 2x1024 registers"),
            ("f32", (32, LOG_SOFTMAX, 4, 1024, 8, True), "256x262144 8x1024 registers log_softmax"),
            ("f32", (8, LOGSUMEXP, 4, 256, 8), "1024x65536 8x256 logsumexp")):
        out.append(Entry("cluster", f"{d} {cfg}", K, (NP[d],) + a, rows(d) + (int64, int64),
                         block=a[3], min_cc=(9, 0)))
    # 16-bit pieces in shared memory are parked in pairs: the arrays as their uint16 bits
    for d, a, cfg in (("f16", (16, SOFTMAX, 8, 256, 4), "1024x65536 4x256 shared pairs"),
                      ("bf16", (16, SOFTMAX, 8, 256, 4), "1024x65536 4x256 shared pairs"),
                      ("f16", (16, SOFTMAX, 8, 256, 8), "256x262144 8x256 shared pairs"),
                      ("bf16", (16, LOG_SOFTMAX, 8, 512, 8), "256x262144 8x512 shared pairs log_softmax")):
        out.append(Entry("cluster", f"{d} {cfg}", K, (NP[d],) + a + (False, True),
                         (C(uint16, 2), C(uint16, 2), int64, int64), block=a[3], min_cc=(9, 0)))
    return out


def _topk():
    """Fused softmax + top-k (kernels.topk.topk.choose, radix=True) and sampling
    (kernels.topk.sample: choose, radix=False); k = 50 (two 32-entry slots a lane), V = 128256."""
    out = []
    ws = lambda d: (C(ACC[d], 3), C(int32, 3), C(ACC[d], 2), C(ACC[d], 2))  # noqa: E731
    head = lambda d, lay=C: (lay(ST[d], 2), int64, ACC[d], int64, int64)  # noqa: E731
    outs = lambda d: (C(ST[d], 2), C(int64, 2))  # noqa: E731
    SEL, MER = "kernels.topk.topk_select:piece_kernel", "kernels.topk.topk_merge:merge_kernel"
    ROWM = "kernels.topk.topk_merge:row_merger"
    # Plan.fused (a plan's only): 63 pieces of 512 × 4, the last piece of the row merges it
    for d, log in (("f32", False), ("f16", False), ("bf16", False), ("f64", False), ("f32", True)):
        then = Ref(ROWM, (NP[d], 8, 512, log))
        out.append(Entry("topk radix fused", f"{d} B1 63x512x4 merge 8/thread{' log' if log else ''}",
                         SEL, (NP[d], 512, 4, W16[d], then),
                         head(d) + ws(d) + (C(int32, 1), int64) + outs(d), block=512))
    out.append(Entry("topk radix fused", "f32 B1 strided x (A)", SEL,
                     (NP["f32"], 512, 4, 4, Ref(ROWM, (NP["f32"], 8, 512, False))),
                     head("f32", A) + ws("f32") + (C(int32, 1), int64) + outs("f32"), block=512))
    # kernel 1: B 1 (63 pieces of 512 × 4; 16-bit: 256 × 8), B 4 (32 of 512 × 8), B 16 (32 of 256 × 16)
    for d, t, per in (("f32", 512, 4), ("f32", 512, 8), ("f32", 256, 16), ("f16", 256, 8),
                      ("bf16", 256, 8), ("f64", 512, 4)):
        out.append(Entry("topk radix piece", f"{d} {t}x{per}", SEL, (NP[d], t, per, W16[d]),
                         head(d) + ws(d), block=t))
    # 16-bit rows that are not whole vectors (a strided view: W 1) hold one value a slot,
    # padded with a −inf converted on the device (a float16 constant is invalid NVVM IR)
    for d in HALF:
        out.append(Entry("topk radix piece", f"{d} 128x8 strided W1 (A)", SEL, (NP[d], 128, 8, 1),
                         head(d, A) + ws(d), block=128))
        out.append(Entry("topk filter", f"{d} 256x8 strided W1 (A)", "kernels.topk.topk_filter:filter_kernel",
                         (NP[d], 256, 8, 1, False), head(d, A) + ws(d) + outs(d), block=256))
    # kernel 2, the bound merge: 512 threads, ⌈S·k/512⌉ a thread (k 50: 8; k 128: 16)
    for d, per, log in (("f32", 8, False), ("f32", 16, False), ("f16", 8, False), ("f32", 8, True),
                        ("f64", 8, False)):
        out.append(Entry("topk merge", f"{d} 512x{per}{' log' if log else ''}", MER,
                         (NP[d], per, 512, log), ws(d) + (int64, int64, int64) + outs(d), block=512))
    # the threshold filter (only a plan's: Plan(filter=True))
    for d, t in (("f32", 512), ("f16", 256)):
        out.append(Entry("topk filter", f"{d} {t}x8", "kernels.topk.topk_filter:filter_kernel",
                         (NP[d], t, 8, W16[d], False), head(d) + ws(d) + outs(d), block=t))
    # the sorted lists: a warp a row (V ≤ 2048), a block a row (B ≥ 132: 8 warps at B 256)
    ROWS = "kernels.topk.topk_rows:kernel|kernels.topk.topk:kernel"
    rowsig = lambda d: (C(ST[d], 2), int64, ACC[d]) + outs(d)  # noqa: E731
    both = (("f32", 128, True, "warp rows V2048"), ("f32", 256, False, "B256 block rows"),
            ("f16", 256, False, "B256 block rows"), ("bf16", 256, False, "B256 block rows"))
    for d, t, vpt, slots, warp_rows, log, scaled, cfg in (  # (scaled: T ≠ 1, " T")
            [(d, t, 16, 2, wr, False, sc, cfg + " T" * sc) for sc in (False, True) for d, t, wr, cfg in both]
            + [("bf16", 64, 16, 1, False, False, True, "B1024 block rows T"),
               ("f64", 256, 8, 2, False, False, True, "B256 block rows T"),
               ("f32", 64, 16, 4, False, True, True, "B1024 block rows k128 log T")]):
        out.append(Entry("topk rows", f"{d} {cfg}", ROWS,
                         (NP[d], t, vpt, W16[d], slots, warp_rows, log, scaled), rowsig(d), block=t))
    for d in HALF:
        out.append(Entry("topk rows", f"{d} B256 block rows strided W1 (A)", ROWS,
                         (NP[d], 256, 16, 1, 2, False, False, False),
                         (A(ST[d], 2), int64, ACC[d]) + outs(d), block=256))
    # the lists' split (B 64: 2 pieces of 512), and sampling's
    PIECE = "kernels.topk.topk_rows:piece_kernel|kernels.topk.topk:piece_kernel"
    for d, slots, perturb in (("f32", 2, False), ("f16", 2, False), ("f32", 1, True)):
        out.append(Entry("topk lists piece", f"{d} 512x16 slots{slots}{' perturbed' if perturb else ''}",
                         PIECE, (NP[d], 512, 16, W16[d], slots, perturb),
                         (C(ST[d], 2), int64, ACC[d], uint64, int64) + ws(d), block=512))
    for d in ("f32", "bf16"):  # the last piece of a row merges it (Plan.fused)
        out.append(Entry("topk lists piece", f"{d} 512x16 slots2 fused", PIECE,
                         (NP[d], 512, 16, W16[d], 2, False, False, 2),
                         (C(ST[d], 2), int64, ACC[d], uint64, int64) + ws(d) + (C(int32, 1),) + outs(d),
                         block=512))
    out.append(Entry("topk lists piece", "f16 512x16 slots2 strided W1 (A)", PIECE,
                     (NP["f16"], 512, 16, 1, 2, False),
                     (A(float16, 2), int64, float32, uint64, int64) + ws("f16"), block=512))
    out.append(Entry("topk lists merge", "f32 512 slots2", "kernels.topk.topk_rows:merge_kernel|kernels.topk.topk:merge_kernel",
                     (NP["f32"], 2, False, 512), ws("f32") + (int64,) + outs("f32"), block=512))
    # sampling: one kernel a row (x, k, inv_t, top_p, seed, tokens), or the lists' split
    SMP = "kernels.topk.sample:kernel"
    for d, t, slots, warp_rows, perturb, cfg in (
            ("f32", 256, 2, False, False, "B256 top_k 50"),
            ("f16", 256, 2, False, False, "B256 top_k 50"),
            ("bf16", 256, 2, False, False, "B256 top_k 50"),
            ("f32", 256, 1, False, True, "B256 Gumbel (top_k None)"),
            ("f32", 128, 2, True, False, "warp rows V2048")):
        out.append(Entry("sample", f"{d} {cfg}", SMP, (NP[d], t, 16, W16[d], slots, warp_rows, perturb),
                         (C(ST[d], 2), int64, ACC[d], ACC[d], uint64, C(int64, 1)), block=t))
    out.append(Entry("sample", "f16 B256 top_k 50 strided W1 (A)", SMP, (NP["f16"], 256, 16, 1, 2, False, False),
                     (A(float16, 2), int64, float32, float32, uint64, C(int64, 1)), block=256))
    for slots, perturb in ((2, False), (1, True)):
        out.append(Entry("sample merge", f"f32 512 slots{slots}{' perturbed' if perturb else ''}",
                         "kernels.topk.sample:merge_kernel", (NP["f32"], slots, perturb, 512),
                         ws("f32") + (int64, float32, uint64, C(int64, 1)), block=512))
    return out


def _with_mods(sig, at):
    """``sig`` with its scale argument (index ``at``) as a score-modified kernel takes it:
    (scale, softcap, slopes)."""
    return sig[:at] + (Tuple((float64, float64, C(float32, 2))),) + sig[at + 1:]


def _attention():
    """Forward attention, split-KV decoding, paged caches and the merges.  q, k, v, o
    (B, H, S, D) views of contiguous arrays (C), or of packed varlen (total, H, D) arrays
    (A: the head axis first, a zero batch stride); LSE float32."""
    out = []
    # CUDA cores (float32; float16/bfloat16 with scale 0): q k v o lse cu_q cu_k varlen
    # tiles scale kv_chunk left right reverse; tiles (flash_tiles.fit_tiles): 128×64 to
    # D 64, 64×32 to 128
    FWD = "kernels.attention.attention:kernel"
    fwd = lambda d, lay, o=None: (lay(ST[d], 4),) * 3 + (lay(ST[o or d], 4), lay(float32, 3),  # noqa: E731
                                  C(int32, 1), C(int32, 1), boolean, int64, float64, int64,
                                  int64, int64, boolean)
    for d, hd, bq, bk, lay, o, cfg in (
            ("f32", 64, 128, 64, C, "f32", "D64 128x64"),
            ("f32", 128, 64, 32, C, "f32", "D128 64x32"),
            ("f32", 128, 64, 32, A, "f32", "D128 64x32 varlen (A)"),
            ("f16", 64, 128, 64, C, "f16", "D64 128x64 scale 0"),
            ("bf16", 128, 64, 32, C, "bf16", "D128 64x32 scale 0")):
        out.append(Entry("attention", f"{d} {cfg}", FWD,
                         (NP[d], hd, hd, bq, bk, None, W16[d], NP[o]), fwd(d, lay, o),
                         block=128))  # (split_rows: 4 warps, 8 or 4 rows a lane)
    # the score modifications (kernels/attention/score_mods.py): the scale argument is
    # (scale, softcap, slopes (1 or B, Hq) float32)
    for (hd, bq, bk, o, cap, alibi) in ((128, 64, 32, "f32", True, True), (64, 128, 64, "f32", True, False),
                                        (128, 64, 32, "f32", False, True)):
        out.append(Entry("attention", f"f32 D{hd} {bq}x{bk}" + " softcap" * cap + " alibi" * alibi,
                         FWD, (NP["f32"], hd, hd, bq, bk, None, 4, NP[o], cap, alibi),
                         _with_mods(fwd("f32", C, o), 9), block=128))
    # tensor cores: q k v o lse cu_q cu_k scale kv_chunk left right; Tiles: 4 warps, Bc 64
    # (32 past D 128), 2 stages, 3 blocks an SM to D 64; o float32 for split partials
    TC = "kernels.attention.attention_tc:kernel"
    tc = lambda d, lay, o=None: (lay(ST[d], 4),) * 3 + (lay(o or ST[d], 4), lay(float32, 3),  # noqa: E731
                                 C(int32, 1), C(int32, 1), float64, int64, int64, int64)
    for d, hd, bk, vec, mb, lay, o, cfg in (
            ("f16", 128, 64, True, None, C, None, "D128"),
            ("bf16", 128, 64, True, None, C, None, "D128"),
            ("f16", 64, 64, True, 3, C, None, "D64 min_blocks 3"),
            ("bf16", 64, 64, True, 3, C, None, "D64 min_blocks 3"),
            ("f16", 256, 32, True, None, C, None, "D256 Bc32"),
            ("f16", 128, 64, True, None, A, None, "D128 varlen (A)"),
            ("f16", 128, 64, False, None, A, None, "D128 unaligned (no cp.async)"),
            ("f16", 128, 64, True, None, C, float32, "D128 float32 partials (split)")):
        out.append(Entry("attention_tc", f"{d} {cfg}", TC,
                         (NP[d], np.float32 if o is float32 else NP[d], hd, hd, 4, bk, 2, vec, mb),
                         tc(d, lay, o), block=128))
    for d, hd, mb, o, cap, alibi in (("f16", 128, None, None, True, True), ("bf16", 128, None, None, True, False),
                                     ("f16", 64, 3, None, False, True), ("f16", 128, None, float32, True, True)):
        out.append(Entry("attention_tc", f"{d} D{hd}" + " softcap" * cap + " alibi" * alibi
                         + (" float32 partials (split)" if o else ""), TC,
                         (NP[d], np.float32 if o is float32 else NP[d], hd, hd, 4, 64, 2, True, mb,
                          cap, alibi), _with_mods(tc(d, C, o), 7), block=128))
    # the merges (one warp a row, 4 a block): merge_splits(o_ws, lse_ws, o, lse) and
    # merge_pair(o_a, lse_a, o_b, lse_b, o, lse)
    M = "kernels.attention.merge:_merge_kernels"
    for d in ("f32", "f16", "bf16"):
        out.append(Entry("merge_splits", d, M, (NP[d], 4),
                         (C(float32, 4), C(float32, 3), C(ST[d], 4), C(float32, 3)), pick=0, block=128))
    for d in ("f32", "f16"):
        out.append(Entry("merge_pair", d, M, (NP[d], 4), (C(ST[d], 4), C(float32, 3)) * 3,
                         pick=1, block=128))
    # split-KV decoding: q k v o lse o_ws lse_ws tickets table seqlens scale left right
    # kv_chunk splits n_chunks page_shift; k, v dense (B, Hkv, Sk, D) or paged pools
    # (blocks, block_size, Hkv, D); GQA 32/8 (4 packed rows), Sq = 1
    dec = lambda d: (C(ST[d], 4),) * 4 + (C(float32, 3), C(float32, 2), C(float32, 1),  # noqa: E731
                     C(int32, 1), C(int32, 2), C(int32, 1), float64, int64, int64, int64,
                     int64, int64, int64)
    DEC = "kernels.decode.decode:kernel"  # CUDA cores: float32/64, D past 128, unaligned
    for d, hd, rows, paged, w, cfg in (
            ("f32", 128, 4, False, 4, "D128 GQA 4 rows"),
            ("f32", 128, 4, True, 4, "D128 GQA 4 rows paged"),
            ("f32", 128, 1, False, 4, "D128 MHA 1 row"),
            ("f64", 128, 4, False, 2, "D128 GQA 4 rows"),
            ("f16", 256, 4, False, 8, "D256 GQA 4 rows"),
            ("bf16", 128, 4, True, 1, "D128 paged unaligned W1")):
        out.append(Entry("decode", f"{d} {cfg}", DEC, (NP[d], hd, hd, rows, 8, paged, w), dec(d),
                         block=256))
    # with the score modifications: (scale, softcap, slopes) at argument 10
    for d, paged, cap, alibi in (("f32", True, True, True), ("f64", False, True, False)):
        out.append(Entry("decode", f"{d} D128 GQA 4 rows" + " paged" * paged + " softcap" * cap
                         + " alibi" * alibi, DEC, (NP[d], 128, 128, 4, 8, paged, 4, cap, alibi),
                         _with_mods(dec(d), 10), block=256))
    DTC = "kernels.decode.decode_tc:kernel"  # tensor cores: tiles_for — 8 warps × 16 keys × 2
    for d, hd, rows, warps, stages, lay, cfg in (  # stages for few blocks, else 8 × 16 × 3
            ("f16", 128, 4, 8, 2, "dense", "D128 B1 GQA 8x16x2"),
            ("bf16", 128, 4, 8, 2, "dense", "D128 B1 GQA 8x16x2"),
            ("f16", 128, 4, 8, 3, "dense", "D128 B16 GQA 8x16x3"),
            ("f16", 128, 4, 8, 2, "pages", "D128 B1 GQA 8x16x2 pages"),
            ("bf16", 128, 4, 8, 3, "pages", "D128 B16 GQA 8x16x3 pages"),
            ("f16", 128, 4, 8, 3, "rows", "D128 B16 GQA 8x16x3 rows"),
            ("f16", 128, 16, 8, 2, "dense", "D128 16 rows (Sq 4) 8x16x2"),
            ("f16", 128, 1, 8, 3, "dense", "D128 MHA 1 row 8x16x3"),
            ("f16", 64, 4, 8, 2, "dense", "D64 B1 GQA 8x16x2")):
        out.append(Entry("decode_tc", f"{d} {cfg}", DTC, (NP[d], hd, hd, rows, warps, 16, stages, lay),
                         dec(d), block=32 * warps))
    for d, lay, cap, alibi in (("f16", "pages", True, True), ("bf16", "dense", False, True)):
        out.append(Entry("decode_tc", f"{d} D128 B16 GQA 8x16x3 {lay}" + " softcap" * cap
                         + " alibi" * alibi, DTC, (NP[d], 128, 128, 4, 8, 16, 3, lay, cap, alibi),
                         _with_mods(dec(d), 10), block=256))
    # the paged cache's writes and its table check
    for d in ("f32", "f16", "bf16"):
        out.append(Entry("append_kv", f"{d} D128", "kernels.decode.append:kernel", (NP[d], 128, 128, W16[d]),
                         (C(ST[d], 4),) * 4 + (C(int32, 2), C(int32, 1)), block=128))
    out.append(Entry("table_check", "int32 tables", "kernels.decode.table_check:kernel", (),
                     (C(int32, 2), C(int32, 1), int64, int64, int64, C(int64, 1)), block=256))
    return out


def _backward():
    """Gradients: the row backward (softmax_backward_launch.plan: a warp, a block or a
    cluster a row, two passes, or split) and FlashAttention-2's backward."""
    out = []
    ONE = "kernels.backward.softmax_backward:one_pass"
    three = lambda t, lay=C: (lay(t, 2),) * 3  # noqa: E731
    for d, a, arrays, cfg in (  # one_pass(dtype, mode, threads, vpt, row_threads, width, size, pack)
            ("f32", (128, 32, 32, 4, 1, False), "f32", "16384x1024 warp rows vpt32"),
            ("f16", (128, 32, 32, 8, 1, False), "f16", "16384x1024 warp rows vpt32"),
            ("bf16", (128, 32, 32, 8, 1, False), "bf16", "16384x1024 warp rows vpt32"),
            ("f32", (512, 16, 512, 4, 1, True), "f32", "4096x8192 block 512 vpt16"),
            ("f16", (256, 32, 256, 8, 1, True), "bf16", "4096x8192 block 256 vpt32 (bits)"),
            ("bf16", (256, 32, 256, 8, 1, True), "bf16", "4096x8192 block 256 vpt32"),
            ("f64", (1024, 8, 1024, 2, 1, True), "f64", "4096x8192 block 1024 vpt8"),
            ("f32", (512, 16, 512, 4, 8, True), "f32", "1024x65536 cluster 8x512 vpt16"),
            ("f16", (256, 32, 256, 8, 8, True), "bf16", "1024x65536 cluster 8x256 vpt32 (bits)"),
            ("bf16", (256, 32, 256, 8, 8, True), "bf16", "1024x65536 cluster 8x256 vpt32"),
            ("f32", (512, 32, 512, 4, 16, True), "f32", "256x262144 cluster 16x512 vpt32"),
            ("bf16", (512, 32, 512, 8, 16, True), "bf16", "256x262144 cluster 16x512 vpt32"),
            ("f64", (512, 16, 512, 2, 8, True), "f64", "1024x65536 cluster 8x512 vpt16")):
        out.append(Entry("softmax_backward", f"{d} {cfg}", ONE, (NP[d], SOFTMAX) + a, three(ST[arrays]),
                         block=a[0], min_cc=(9, 0) if a[4] > 1 else (8, 0)))
    out.append(Entry("softmax_backward", "f32 4096x8192 block 512 vpt16 log_softmax", ONE,
                     (NP["f32"], LOG_SOFTMAX, 512, 16, 512, 4, 1, True), three(float32), block=512))
    out.append(Entry("softmax_backward", "f32 warp rows strided W1 (A)", ONE,
                     (NP["f32"], SOFTMAX, 128, 32, 32, 1, 1, False), three(float32, A), block=128))
    for d in ("f32", "f16", "bf16", "f64"):
        out.append(Entry("softmax_backward.two_pass", f"{d} 1024", "kernels.backward.softmax_backward:two_pass",
                         (NP[d], SOFTMAX, 1024, W16[d]), three(ST[d]), block=1024))
        ws = C(ACC[d], 2)
        out.append(Entry("softmax_backward.piece_sums", f"{d} 1024", "kernels.backward.softmax_backward:split",
                         (NP[d], SOFTMAX, 1024, W16[d]), three(ST[d])[:2] + (int64, ws), pick=0,
                         block=1024))
        out.append(Entry("softmax_backward.piece_write", f"{d} 1024", "kernels.backward.softmax_backward:split",
                         (NP[d], SOFTMAX, 1024, W16[d]), three(ST[d]) + (int64, ws), pick=1,
                         block=1024))
    out.append(Entry("softmax_backward.two_pass", "f32 1024 log_softmax", "kernels.backward.softmax_backward:two_pass",
                     (NP["f32"], LOG_SOFTMAX, 1024, 4), three(float32), block=1024))
    # attention: do q k v lse delta dq_acc dk dv scale left right (dq_acc: dq itself for
    # float32/64, a float32 scratch for 16-bit); CUDA cores: fit_tiles (Br, Bc, W)
    bwd = lambda d, lse="f32": (C(ST[d], 4),) * 4 + (C(ST[lse], 3), C(ACC[d], 3), C(ACC[d], 4),  # noqa: E731
                                                     C(ST[d], 4), C(ST[d], 4), float64, int64, int64)
    AB = "kernels.backward.attention_backward:kernel"  # (…, tiles, values a global load, dQ adds in fours)
    red4 = CC >= (9, 0)  # red.global.add.v4.f32: sm_90
    for d, hd, tiles, lse, vec in (("f32", 64, (64, 64, 4), "f32", 4), ("f32", 128, (32, 32, 4), "f32", 4),
                                   ("f64", 64, (32, 32, 4), "f64", 2), ("f16", 64, (64, 64, 4), "f32", 8),
                                   ("f32", 128, (32, 32, 4), "f32", 1)):
        out.append(Entry("attention_backward", f"{d} D{hd} {'x'.join(map(str, tiles))}"
                         + (" scale 0" if d == "f16" else "") + (" strided" if vec == 1 else ""), AB,
                         (NP[d], hd, hd) + tiles + (vec, red4 and d == "f32" and vec > 1), bwd(d, lse),
                         block=32 * tiles[2]))
    # the score modifications (score_mods): the scale argument is (scale, softcap, slopes)
    for d, hd, tiles, vec, cap, alibi in (("f32", 64, (64, 64, 4), 4, True, True),
                                          ("f32", 128, (32, 32, 4), 4, True, False),
                                          ("f64", 64, (32, 32, 4), 2, False, True)):
        out.append(Entry("attention_backward", f"{d} D{hd} {'x'.join(map(str, tiles))}"
                         + " softcap" * cap + " alibi" * alibi, AB,
                         (NP[d], hd, hd) + tiles + (vec, red4 and d == "f32", cap, alibi),
                         _with_mods(bwd(d, d), 9), block=32 * tiles[2]))
    ABT = "kernels.backward.attention_backward_tc:kernel"  # tensor cores: Tiles W 8, Br 64
    pairs = CC >= (9, 0)  # dQ's vector atomic adds: sm_90
    for d, hd in (("f16", 128), ("bf16", 128), ("f16", 64)):
        out.append(Entry("attention_backward_tc", f"{d} D{hd} 8 warps Br64", ABT,
                         (NP[d], hd, hd, 8, 64, True, pairs), bwd(d), block=256))
    out.append(Entry("attention_backward_tc", "f16 D128 unaligned (no cp.async)", ABT,
                     (NP["f16"], 128, 128, 8, 64, False, pairs), bwd("f16"), block=256))
    out.append(Entry("attention_backward_tc", "f16 D128 4 warps Br32 (99 KB devices)", ABT,
                     (NP["f16"], 128, 128, 4, 32, True, pairs), bwd("f16"), block=128))
    for d, hd, cap, alibi in (("f16", 128, True, True), ("bf16", 128, True, False), ("f16", 64, False, True)):
        out.append(Entry("attention_backward_tc", f"{d} D{hd} 8 warps Br64" + " softcap" * cap
                         + " alibi" * alibi, ABT, (NP[d], hd, hd, 8, 64, True, pairs, cap, alibi),
                         _with_mods(bwd(d), 9), block=256))
    # hb1: the wgmma backward (kernels/backward/hopper_backward.py), for sm_90a
    HB = "kernels.backward.hopper_backward"
    for kind, d, dv, vec in (("f16", 64, 64, 8), ("bf16", 128, 128, 8), ("f16", 128, 128, 1)):
        u4 = (A(uint16, 4),) * 4
        out.append(Entry("attention_backward.hopper", f"dkdv {kind} D{d} vec {vec}",
                         f"{HB}:dkdv_kernel", (kind, NP[kind], d, dv, vec),
                         u4 + (A(float32, 3), C(float32, 3), A(ST[kind], 4), A(ST[kind], 4),
                               float64, int64, int64), block=128, min_cc=(9, 0), arch="a"))
        out.append(Entry("attention_backward.hopper", f"dq {kind} D{d} vec {vec}",
                         f"{HB}:dq_kernel", (kind, d, dv, vec),
                         u4 + (A(float32, 3), C(float32, 3), C(float32, 4), float64, int64, int64),
                         block=128, min_cc=(9, 0), arch="a"))
    HW = "kernels.backward.hopper_backward_ws"  # hb2: TMA-fed, a producer warp
    for kind, d in (("f16", 64), ("bf16", 128), ("f16", 128)):
        maps = (C(uint64, 1),) * 4
        fused = d == 64  # dQ added by the dK/dV kernel at D 64
        out.append(Entry("attention_backward.hopper_ws", f"dkdv {kind} D{d}" + " fused" * fused,
                         f"{HW}:dkdv_kernel", (kind, NP[kind], d, d, fused),  # + LSE, D maps
                         maps + maps[:2] + (A(ST[kind], 4), A(ST[kind], 4), C(float32, 4),
                                            int64, int64, float64, int64, int64), block=160,
                         min_cc=(9, 0), arch="a"))
        out.append(Entry("attention_backward.hopper_ws", f"dq {kind} D{d}",
                         "kernels.backward.hopper_backward_dq:dq_kernel", (kind, d, d),
                         maps + (A(float32, 3), C(float32, 3), C(float32, 4), int64, int64,
                                 float64, int64, int64), block=160, min_cc=(9, 0), arch="a"))
    out.append(Entry("attention_backward.hopper_ws", "padded_rows",  # (lse, delta, l2, dl)
                     "kernels.backward.hopper_backward_parts:padded_rows", (),
                     (A(float32, 3),) + (C(float32, 3),) * 3, block=128))
    IO = "kernels.backward.attention_backward_io"
    for d in ("f32", "f16", "bf16", "f64"):  # preprocess(do, o, delta, dq_acc)
        out.append(Entry("attention_backward.preprocess", d, f"{IO}:preprocess", (NP[d],),
                         (C(ST[d], 4), C(ST[d], 4), C(ACC[d], 3), C(ACC[d], 4)), block=128))
    for d in HALF:  # convert(dq_acc, dq)
        out.append(Entry("attention_backward.convert", d, f"{IO}:convert", (NP[d],),
                         (C(float32, 4), C(ST[d], 4)), block=128))
    return out


def _plumbing():
    """The strided copy of the array layer, the combiner's device folds (cli tour, tests),
    and the benchmark's own kernels."""
    out = []
    six = UniTuple(int64, 6)
    for name, t in (("f32", float32), ("f16", float16), ("bf16", uint16), ("f64", float64),
                    ("int64", int64)):
        out.append(Entry("copy", name, "runtime.copy:_kernel", (),
                         (C(t, 1), int64, six, C(t, 1), int64, six, six, int64), block=256))
    for d in ("f32", "f64"):
        t = ST[d]
        out.append(Entry("fold.chunk_states", d, "kernels.softmax.fold:_kernels", (NP[d],),
                         (C(t, 2), C(int64, 1), C(t, 2), C(t, 2)), pick="chunk_states"))
        out.append(Entry("fold.fold_tree", d, "kernels.softmax.fold:_kernels", (NP[d],),
                         (C(t, 2), C(t, 2), C(int64, 2), int64, C(t, 1), C(t, 1)), pick="fold_tree",
                         block=32))
        out.append(Entry("fold_topk.chunk_states", d, "kernels.topk.fold_topk:_kernels", (NP[d],),
                         (C(t, 2), C(int64, 1), C(t, 2), C(t, 2), C(t, 3), C(int64, 3)), pick=0))
        out.append(Entry("fold_topk.fold_tree", d, "kernels.topk.fold_topk:_kernels", (NP[d],),
                         (C(t, 2), C(t, 2), C(t, 3), C(int64, 3), C(int64, 2), int64, C(t, 2),
                          C(int64, 2)), pick=1, block=32))
    out.append(Entry("bench.read_all", "f32", "bench.bounds:_read_kernel", (),
                     (C(float32, 1), C(float32, 1)), block=256))
    for name, t in (("float32", float32), ("float16", float16), ("bfloat16", uint16)):
        out.append(Entry("bench.fill", name, "bench.context:_fill_kernel", (name,),
                         (C(t, 1), int64, float32, float32), block=256))
    out.append(Entry("bench.sleep", "-", "bench.timing:_sleep_kernel", (), (int64, uint32), block=1))
    # the Hopper primitives' own kernels (kernels/hw/wgmma.py, tma.py), for sm_90a
    for n, kind, regs, tb in ((64, "f16", 0, False), (256, "bf16", 0, False), (64, "f16", 232, False),
                              (128, "f16", 0, True)):
        out.append(Entry("hw.wgmma", f"{kind} m64n{n}k16 x4" + (f" setmaxnreg {regs}" if regs else "")
                         + (" N-major B" if tb else ""),
                         "kernels.hw.wgmma:example_kernel", (n, kind, 4, regs, tb),
                         (C(uint16, 2), C(uint16, 2), C(float32, 2)), block=128, min_cc=(9, 0),
                         arch="a"))
    # the wgmma attention forward (kernels/attention/hopper.py), for sm_90a
    for kind, d, vec, vn in (("f16", 64, 8, False), ("bf16", 128, 8, False), ("f16", 128, 8, False),
                             ("f16", 64, 1, False), ("f16", 128, 8, True)):
        t = ST[kind]
        out.append(Entry("attention.hopper", f"{kind} D{d} vec {vec}" + (" V N-major" if vn else ""),
                         "kernels.attention.hopper:kernel", (kind, NP[kind], d, d, vec, vn),
                         (A(uint16, 4), A(uint16, 4), A(uint16, 4), A(t, 4), A(float32, 3),
                          float64, boolean), block=128, min_cc=(9, 0), arch="a"))
    # h2 … h7: the warp-specialized, TMA-fed ones
    for kind, d, cfg in (("f16", 64, "h2"), ("bf16", 128, "h2"), ("f16", 64, "h3"),
                         ("f16", 128, "h3"), ("bf16", 128, "h3"), ("f16", 64, "h4"),
                         ("f16", 128, "h4"), ("bf16", 128, "h5"), ("f16", 64, "h6"),
                         ("bf16", 128, "h6"), ("f16", 64, "h7"), ("bf16", 64, "h7")):
        out.append(Entry("attention.hopper_ws", f"{kind} D{d} {cfg}",
                         "kernels.attention.hopper_ws:kernel", (kind, NP[kind], d, d, cfg),
                         (C(uint64, 1), C(uint64, 1), C(uint64, 1), A(ST[kind], 4), A(float32, 3),
                          int64, int64, float64, boolean), pick=0,
                         block={"h2": 160, "h7": 512}.get(cfg, 384), min_cc=(9, 0), arch="a"))
    for rows, sw in ((64, 1), (16, 0)):
        out.append(Entry("hw.tma", f"box {rows}x64 f16 swizzle {sw}", "kernels.hw.tma:example_kernel",
                         (rows, 64, sw), (C(uint64, 1), int64, int64, int64, int64, C(uint16, 1)),
                         block=128, min_cc=(9, 0), arch="a"))
    for rank in (3, 4):
        out.append(Entry("hw.tma", f"box 64x64 f16 swizzle 1, {rank}-D", "kernels.hw.tma:example_kernel",
                         (64, 64, 1, rank), (C(uint64, 1), int64, int64, int64, int64, C(uint16, 1)),
                         block=128, min_cc=(9, 0), arch="a"))
    return out


TABLE = _softmax() + _topk() + _attention() + _backward() + _plumbing()


def _params(target, root=REPO):
    """The parameter names of the factory ``module:name`` (the first of "a|b" found),
    read from its source: nothing is imported."""
    import ast

    for t in target.split("|"):
        mod, fac = t.split(":")
        path = os.path.join(root, "numba_softmax", *mod.split(".")) + ".py"
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for node in ast.parse(f.read()).body:
                    if isinstance(node, ast.FunctionDef) and node.name == fac:
                        return [a.arg for a in node.args.args]
    return []


def strided_16(table, root=REPO):
    """Each 16-bit entry whose factory takes ``width``, again at width 1 with its 2-D
    arrays of the storage dtype strided ("A"): what a strided view of a user's float16 or
    bfloat16 array compiles (``--strided-16``).  A float16 constant broke only those —
    every strided float16 top-k failed on a GPU — while no entry of the table had one."""
    out, seen = [], {(e.target, repr(list(e.args)), e.sig) for e in table}  # (the table's own W 1 rows)
    for e in table:
        d = e.config.split()[0]
        names = _params(e.target, root) if d in HALF else []
        if "width" not in names or names.index("width") >= len(e.args) or e.args[names.index("width")] == 1:
            continue  # (no width, or the entry is at width 1 already)
        args = list(e.args)
        args[names.index("width")] = 1
        sig = tuple(A(t.dtype, 2) if isinstance(t, Array) and t.ndim == 2 and t.dtype == ST[d] else t
                    for t in e.sig)
        if (e.target, repr(args), sig) not in seen:
            seen.add((e.target, repr(args), sig))
            out.append(e._replace(config=e.config + " [strided W1]", args=tuple(args), sig=sig))
    return out


STRIDED_16 = strided_16(TABLE)
ENTRIES = {e.key: e for e in TABLE + STRIDED_16}
assert len(ENTRIES) == len(TABLE) + len(STRIDED_16), "two entries share a name and configuration"
HEAVY = ("attention", "decode", "topk radix", "topk merge", "topk filter")  # compiled first


# --- rendering (ptxinfo's forms) -----------------------------------------------------------
def _value(a):
    if isinstance(a, type) and issubclass(a, np.generic):
        return f"np.{a.__name__}"
    if isinstance(a, Ref):
        mod, fac = a.target.split("|")[0].split(":")
        return f"importlib.import_module('numba_softmax.{mod}').{fac}({_args(a.args)})"
    return repr(a)


def _args(args):
    return ", ".join(_value(a) for a in args)


def _type(t):
    if isinstance(t, Array):
        dims = [":"] * t.ndim
        if t.layout == "C":
            dims[-1] = "::1"
        return f"{t.dtype}[{', '.join(dims)}]"
    if isinstance(t, UniTuple):
        return f"UniTuple({t.dtype}, {t.count})"
    return str(t)


def ptxinfo_command(e, root=REPO):
    """The entry as a ``scripts/ptxinfo.py`` command line (PYTHONPATH: ptxinfo imports the
    installed numba_softmax otherwise; of a tuple it takes the first kernel)."""
    mod, fac = e.target.split("|")[0].split(":")
    sig = ", ".join(_type(t) for t in e.sig)
    pick = "" if e.pick == 0 else f"  # then item {e.pick!r} of what it returns"
    return (f"PYTHONPATH={root} python {os.path.relpath(__file__, REPO)[:-len('compile_check.py')]}"
            f"ptxinfo.py numba_softmax.{mod}:{fac} \"({_args(e.args)}{',' if len(e.args) == 1 else ''})\" "
            f"\"({sig}{',' if len(e.sig) == 1 else ''})\"{pick}")


# --- the worker: compiles entries in a process of its own ----------------------------------
def _limits():
    from numba_softmax.runtime import launcher

    try:  # an H100: what a factory sizes from, if one asks (there is no device to ask)
        h100 = launcher.Limits("NVIDIA H100 80GB HBM3", sms=132, max_threads=1024,
                               shared_optin=227 * 1024, shared_per_sm=228 * 1024,
                               l2_bytes=50 * 1024 * 1024, cc=CC)
    except (AttributeError, TypeError):  # (an older tree's launcher)
        return
    launcher.device_limits = lambda: h100


def _resolve(target):
    """The factory ``module:name`` (under numba_softmax) — the first of "a|b" that exists."""
    import importlib

    errors = []
    for t in target.split("|"):
        mod, fac = t.split(":")
        try:
            return getattr(importlib.import_module(f"numba_softmax.{mod}"), fac)
        except (ImportError, AttributeError) as e:
            errors.append(f"{t}: {type(e).__name__}: {e}")
    raise LookupError("; ".join(errors))


def _build(e):
    def arg(a):
        return _resolve(a.target)(*(arg(b) for b in a.args)) if isinstance(a, Ref) else a

    k = _resolve(e.target)(*(arg(a) for a in e.args))
    if isinstance(k, (tuple, list, dict)):
        k = k[e.pick]
    return k


def _parse(report):
    """(registers, spill stores, spill loads, stack, static shared bytes) of the entry
    function in ptxas -v's report."""
    entry = re.search(r"Compiling entry function '([^']+)'", report)
    section = report[entry.start():] if entry else report
    name = re.escape(entry.group(1)) if entry else r"\S+"
    props = re.search(r"Function properties for " + name + r"\s*\n\s*(.*)", section)
    frame = props.group(1) if props else section

    def num(pattern, text):
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0

    used = re.search(r"Used (\d+) registers[^\n]*", section)
    line = used.group(0) if used else ""
    return dict(regs=int(used.group(1)) if used else None,
                spill_st=num(r"(\d+) bytes spill stores", frame),
                spill_ld=num(r"(\d+) bytes spill loads", frame),
                stack=num(r"(\d+) bytes stack frame", frame),
                smem=num(r"(\d+) bytes smem", line))


def _max_threads(regs, launch_bounds):
    """Threads a block can launch: 64K registers a block, allocated 256 a warp; at most
    1024, and at most the kernel's launch bounds."""
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    most = min(1024, REGISTERS_PER_BLOCK // per_warp * 32)
    if launch_bounds:
        bound = launch_bounds[0] if isinstance(launch_bounds, (tuple, list)) else launch_bounds
        most = min(most, bound)
    return most


def compile_entry(e, ptx_dir=None, as_linked=False):
    """Compile one entry; a dict: status ("ok", or the stage that failed: "build" — the
    factory — "compile" — Numba/NVVM — or "ptxas"), the numbers, the error."""
    from numba import cuda

    t0 = time.perf_counter()
    try:
        k = _build(e)
    except Exception as exc:  # noqa: BLE001 — reported, the next entry goes on
        return dict(status="build", error=_error(exc), seconds=time.perf_counter() - t0)
    opts = getattr(k, "targetoptions", {})
    try:
        cc = CC + (e.arch,) if e.arch else CC  # (9, 0, "a"): NVVM's sm_90a
        ptx, _ = cuda.compile_ptx(k.py_func, e.sig, cc=cc, fastmath=opts.get("fastmath", False),
                                  launch_bounds=opts.get("launch_bounds"))
    except Exception as exc:  # noqa: BLE001
        return dict(status="compile", error=_error(exc), seconds=time.perf_counter() - t0)
    ptx = ptx.replace(".version 9.5", ".version 9.0")  # (as ptxinfo: this ptxas's PTX ISA)
    if not as_linked:
        ptx = canonical(ptx)
    d = tempfile.mkdtemp(prefix="compile_check_")
    try:
        with open(f"{d}/k.ptx", "w") as f:
            f.write(ptx)
        relocatable = ["-c"] if "cudaCGGetIntrinsicHandle" in ptx else []  # cooperative
        cap = [f"-maxrregcount={opts['max_registers']}"] if opts.get("max_registers") else []
        r = subprocess.run(["ptxas", f"-arch=sm_{CC[0]}{CC[1]}{e.arch}", "-v", *relocatable, *cap,
                            f"{d}/k.ptx", "-o", f"{d}/k.cubin"], capture_output=True, text=True)
        report = r.stdout + r.stderr
        if ptx_dir:
            base = os.path.join(ptx_dir, re.sub(r"[^A-Za-z0-9_.-]+", "_", e.key))
            shutil.copy(f"{d}/k.ptx", base + ".ptx")
            with open(base + ".ptxas.txt", "w") as f:
                f.write(report)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        return dict(status="ptxas", error=report.strip(), seconds=seconds)
    got = _parse(report)
    if got["regs"] is None:
        return dict(status="ptxas", error="no register count in ptxas's report:\n" + report,
                    seconds=seconds)
    got.update(status="ok", seconds=seconds, relocatable=bool(relocatable),
               threads=_max_threads(got["regs"], opts.get("launch_bounds")),
               warning=next((ln.strip() for ln in report.splitlines() if "warning" in ln), ""))
    return got


_SHARED = re.compile(r"^\.visible \.shared [^\n]*?_cudapy_smem_(\d+)\[[^\n]*\n", re.M)


def canonical(ptx):
    """The PTX with its module-scope shared arrays declared in the order Numba made them
    (``_cudapy_smem_N``, by N).  NVVM declares each device function's arrays in that
    order, but the functions' groups in the order it links their modules, which changes
    from process to process; the order is the shared-memory layout, and it moves ptxas's
    register count (the fused radix top-k: 126 or 128 registers).  In one order the
    numbers repeat; the order chosen is the one NVVM gives when it links the modules in
    the order they were made."""
    decls = list(_SHARED.finditer(ptx))
    if len(decls) < 2:
        return ptx
    text = ptx
    for m in reversed(decls):
        text = text[:m.start()] + text[m.end():]
    ordered = "".join(m.group(0) for m in sorted(decls, key=lambda m: int(m.group(1))))
    return text[:decls[0].start()] + ordered + text[decls[0].start():]


def _error(exc):
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 6000 else text[:3000] + "\n…\n" + text[-3000:]


def worker(root, ptx_dir, as_linked):
    """Read entry keys on stdin, one a line; answer each with one line ``@@{json}``."""
    sys.path.insert(0, os.path.abspath(root))
    import types as _t

    import numba.cuda.dispatcher as _disp

    _disp.get_current_device = lambda: _t.SimpleNamespace(compute_capability=CC)  # no GPU here
    import numba_softmax

    where = os.path.dirname(os.path.abspath(numba_softmax.__file__))
    if not where.startswith(os.path.abspath(root)):
        sys.exit(f"numba_softmax came from {where}, not from {root}")
    _limits()
    out = sys.stdout
    sys.stdout = sys.stderr  # anything the package prints stays off the answers' channel
    out.write("@@" + json.dumps(dict(ready=where)) + "\n")
    out.flush()
    for line in sys.stdin:
        key = line.strip()
        if not key:
            continue
        result = compile_entry(ENTRIES[key], ptx_dir, as_linked)
        out.write("@@" + json.dumps(dict(key=key, **result)) + "\n")
        out.flush()


# --- the pool: worker processes fed by threads ---------------------------------------------
class Worker:
    """One worker process for one tree; :meth:`run` sends it an entry and waits."""

    def __init__(self, root, ptx_dir, timeout, as_linked):
        self.root, self.timeout = root, timeout
        self.err = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--root", root]
        cmd += ["--ptx-dir", ptx_dir] if ptx_dir else []
        cmd += ["--as-linked"] if as_linked else []
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True, bufsize=1)
        ready = self._answer(120)
        if ready is None or "ready" not in ready:
            raise RuntimeError(f"a worker for {root} did not start:\n{self._stderr()}")

    def _answer(self, timeout):
        def kill():
            self.timed_out = True
            self.proc.kill()

        self.timed_out = False
        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            for line in self.proc.stdout:
                if line.startswith("@@"):
                    return json.loads(line[2:])
            return None  # the process ended
        finally:
            timer.cancel()

    def _stderr(self, lines=25):
        self.err.seek(0)
        return "\n".join(self.err.read().splitlines()[-lines:])

    def run(self, key):
        t0 = time.perf_counter()
        self.proc.stdin.write(key + "\n")
        self.proc.stdin.flush()
        got = self._answer(self.timeout)
        if got is not None:
            return got
        elapsed = time.perf_counter() - t0
        self.proc.wait()
        why = (f"timed out after {self.timeout:.0f} s" if self.timed_out else
               f"the worker died (exit status {self.proc.returncode})")
        return dict(status="worker", error=f"{why}\n{self._stderr()}", seconds=elapsed, dead=True)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.err.close()


def run_pool(jobs, n_workers, ptx_dir, timeout, as_linked, done):
    """Compile ``jobs`` ((root, entry) pairs) on ``n_workers`` threads, each keeping a
    worker process a tree; ``done(root, entry, result)`` as each finishes."""
    todo = queue.Queue()
    for job in jobs:
        todo.put(job)

    def thread():
        procs = {}
        try:
            while True:
                try:
                    root, e = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    if root not in procs:
                        procs[root] = Worker(root, ptx_dir, timeout, as_linked)
                    result = procs[root].run(e.key)
                except Exception as exc:  # noqa: BLE001 — a worker that cannot start
                    result = dict(status="worker", error=_error(exc), seconds=0.0, dead=True)
                if result.pop("dead", False) and root in procs:
                    procs.pop(root).close()  # the next entry gets a fresh one
                done(root, e, result)
        finally:
            for p in procs.values():
                p.close()

    threads = [threading.Thread(target=thread, daemon=True) for _ in range(max(1, n_workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# --- the report ----------------------------------------------------------------------------
def _cells(r, block, loads=True):
    """(regs, spill, smem, thr) of one result, or the failure's word (``-``: n/a).
    ``loads``: spill stores/loads where they differ (else stores alone)."""
    if r["status"] == "n/a":
        return ("-",) * 4
    if r["status"] != "ok":
        return ("FAIL", "-", "-", "-")
    spill = str(r["spill_st"])
    if loads and r["spill_ld"] != r["spill_st"]:
        spill += f"/{r['spill_ld']}"
    thr = f"{'<' if block and r['threads'] < block else ''}{r['threads']}"
    return str(r["regs"]) + ("c" if r.get("relocatable") else ""), spill, str(r["smem"]), thr


def _first_line(error):
    lines = [re.sub(r"_Z[A-Za-z0-9_]{40,}", "<kernel>", ln.strip()) for ln in error.splitlines()
             if ln.strip()]
    for ln in lines:  # ptxas and NVVM name the problem on an "error" line
        if "error" in ln.lower() and not ln.startswith("Traceback"):
            return ln
    return lines[0] if lines else "?"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", metavar="SUBSTRING",
                   help="entries whose name and configuration contain it (repeatable: any)")
    p.add_argument("--root", default=REPO, help="the folder holding the numba_softmax to check "
                   "(default: this checkout)")
    p.add_argument("--compare", metavar="OTHER_ROOT", help="also compile another tree's "
                   "numba_softmax and print both side by side")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1,
                   help="worker processes (default: os.cpu_count())")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds an entry may take")
    p.add_argument("--strided-16", action="store_true", help="also every 16-bit entry whose "
                   "factory takes a width, at width 1 with strided arrays (a strided view's kernels)")
    p.add_argument("--list", action="store_true", help="print the table; compile nothing")
    p.add_argument("--cc", metavar="MAJOR.MINOR", help="compile for this target instead of "
                   f"sm_{CC[0]}{CC[1]} (8.0: A100, 8.6/8.9: RTX 30xx/40xx; the entries that need "
                   "sm_90 are left out)")
    p.add_argument("--ptx-dir", help="keep each entry's PTX and ptxas report here")
    p.add_argument("--as-linked", action="store_true", help="hand ptxas the PTX as NVVM "
                   "wrote it (shared arrays in link order: registers may vary between runs)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="print each entry's factory call and signature (ptxinfo's form)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cc and tuple(int(x) for x in args.cc.split(".")) != CC:  # the table depends on it
        os.environ["NUMBA_SOFTMAX_CHECK_CC"] = args.cc
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__)]
                 + list(sys.argv[1:] if argv is None else argv))
    if args.worker:
        return worker(args.root, args.ptx_dir, args.as_linked)

    table = TABLE + (STRIDED_16 if args.strided_16 else [])
    entries = [e for e in table if not args.only or any(s in e.key for s in args.only)]
    newer = [e for e in entries if e.min_cc > CC]
    entries = [e for e in entries if e.min_cc <= CC]
    if newer:
        print(f"{len(newer)} entries need a newer target than sm_{CC[0]}{CC[1]}: left out")
    if not entries:
        sys.exit(f"no entry matches {args.only}")
    if args.list:
        for e in entries:
            print(f"{e.key}\n    {ptxinfo_command(e, os.path.abspath(args.root))}")
        print(f"{len(entries)} entries")
        return 0
    if shutil.which("ptxas") is None:
        sys.exit("ptxas is not on the PATH")
    if args.ptx_dir:
        os.makedirs(args.ptx_dir, exist_ok=True)
    roots = [os.path.abspath(args.root)] + ([os.path.abspath(args.compare)] if args.compare else [])
    for r in roots:
        if not os.path.isdir(os.path.join(r, "numba_softmax")):
            sys.exit(f"{r} holds no numba_softmax package")
    this, other = roots[0], roots[1] if len(roots) > 1 else None
    foreign = os.path.realpath(this) != os.path.realpath(REPO)  # not the table's own tree
    print(f"this tree:  {this}" + (f"\nother tree: {other}" if other else ""))
    version = re.search(r"V\d[\d.]*", subprocess.run(["ptxas", "--version"], capture_output=True,
                                                     text=True).stdout)
    print(f"{len(entries)} entries, {args.jobs} workers, sm_{CC[0]}{CC[1]}, ptxas "
          f"{version.group(0) if version else '?'}")

    width = max(len(e.name) for e in entries), max(len(e.config) for e in entries)
    if other:
        head = (f"{'kernel':{width[0]}} {'configuration':{width[1]}} {'regs':>9} {'spill':>9} "
                f"{'smem':>11} {'thr':>9} {'s':>5}  status")
    else:
        head = (f"{'kernel':{width[0]}} {'configuration':{width[1]}} {'regs':>5} {'spill':>7} "
                f"{'smem':>6} {'thr':>5} {'s':>5}  status")
    print(head)
    print("-" * len(head))

    results = {}
    order = list(entries)
    printed = [0]
    lock = threading.Lock()
    t0 = time.perf_counter()

    def finished(e):
        return all((root, e.key) in results for root in roots)

    def line(e):
        mine = results[(this, e.key)]
        if foreign and mine["status"] == "build":  # a factory this other tree lacks
            mine = results[(this, e.key)] = dict(mine, status="n/a")
        cells = _cells(mine, e.block)
        status = ("ok" if mine["status"] == "ok" else
                  f"n/a: {_first_line(mine['error'])}" if mine["status"] == "n/a" else
                  f"{mine['status']} error: {_first_line(mine['error'])}")
        if mine["status"] == "ok" and mine.get("warning"):
            status = f"ok (ptxas: {mine['warning'][:80]})"
        if other:
            theirs = results[(other, e.key)]
            if theirs["status"] == "build":
                theirs = dict(theirs, status="n/a")
            cells, old = _cells(mine, e.block, False), _cells(theirs, e.block, False)
            pairs = [f"{a}/{b}" for a, b in zip(cells, old)]
            text = (f"{e.name:{width[0]}} {e.config:{width[1]}} {pairs[0]:>9} {pairs[1]:>9} "
                    f"{pairs[2]:>11} {pairs[3]:>9} {mine['seconds']:5.1f}  {status}")
            if theirs["status"] not in ("ok", "n/a"):
                text += f"  [other: {theirs['status']} error: {_first_line(theirs['error'])}]"
        else:
            text = (f"{e.name:{width[0]}} {e.config:{width[1]}} {cells[0]:>5} {cells[1]:>7} "
                    f"{cells[2]:>6} {cells[3]:>5} {mine['seconds']:5.1f}  {status}")
        if args.verbose:
            text += f"\n    {ptxinfo_command(e, this)}"
        return text

    def done(root, e, result):
        with lock:
            results[(root, e.key)] = result
            while printed[0] < len(order) and finished(order[printed[0]]):
                print(line(order[printed[0]]), flush=True)
                printed[0] += 1

    heavy = lambda e: not any(e.name.startswith(h) for h in HEAVY)  # noqa: E731  (False first)
    jobs = [(root, e) for e in sorted(entries, key=heavy) for root in roots]
    run_pool(jobs, args.jobs, args.ptx_dir, args.timeout, args.as_linked, done)

    failed = [e for e in entries if results[(this, e.key)]["status"] not in ("ok", "n/a")]
    absent = sum(results[(this, e.key)]["status"] == "n/a" for e in entries)
    for e in failed:
        r = results[(this, e.key)]
        print(f"\n=== FAILED: {e.key} ({r['status']})\n    {ptxinfo_command(e, this)}\n{r['error']}")
    if other:
        for e in entries:
            r = results[(other, e.key)]
            if r["status"] not in ("ok", "build"):
                print(f"\n=== other tree, failed: {e.key} ({r['status']})\n{r['error']}")
    print(f"\n{len(entries) - len(failed) - absent} of {len(entries)} entries compiled"
          + (f", {len(failed)} FAILED" if failed else "")
          + (f", {absent} n/a (factories {this} lacks)" if absent else "")
          + f" in {time.perf_counter() - t0:.0f} s ({args.jobs} workers)")
    print("regs …c: compiled relocatable (a cooperative kernel: its own registers); spill: bytes "
          "stored" + (" (this tree/other tree in each column)" if other else ", /loaded where "
          "they differ") + "; thr <: fewer than the block the entry names")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
