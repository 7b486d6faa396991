"""The softmax kernels at the kernel level: every method × dtype × mode against float64.

Each case is sized so that it crosses what the kernel has to get right: two warps in a
team, two chunks per thread, a ragged end, two pieces (split), two blocks exchanging
(m, ℓ) — with a spilled share — and two rows through one group (group).  On the
simulator blocks have 64 threads, so the shapes are tiny: one 16-byte vector per thread
per chunk (``vpt`` = W), a group of two blocks with a "shared memory" of ~1.5 KB.

Also here: widths at each threshold (a new values-per-thread step, a new team, the
fused and on-chip limits), precision (long float16 rows must accumulate in float32;
log_softmax must not be log(softmax)), special values across warp/chunk boundaries in
negative-stride views, and host-only checks of every launch configuration against the
compiled kernel's thread limit and the group's arithmetic.
"""

import math

import numpy as np
import pytest
from numba import cuda

from numba_softmax import reference as R
from numba_softmax.kernels.softmax import cluster, crossover_table, fused, group, methods, onchip
from numba_softmax.runtime import launcher
from numba_softmax.kernels.hw import vector
from numba_softmax.kernels.rows.epilogue import LOGSUMEXP, MODES

from _helpers import SIMULATOR, sized

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # simulator: 1/0 of idle teams

T = 64  # threads per block on the simulator (two warps); the GPU sizes its own
CLUSTER_TESTS = ("test_cluster_pieces_in_registers", "test_cluster_parks_16_bit_rows_in_pairs")


@pytest.fixture(autouse=True)
def _clusters_only_where_they_run(request):
    """A test of method 'cluster' skips on a GPU without thread-block clusters (before
    sm_90, or ``NUMBA_SOFTMAX_TEST_AS``): the package refuses it there (tested below)."""
    spec = getattr(request.node, "callspec", None)
    if ((spec is not None and spec.params.get("method") == "cluster")
            or request.node.originalname in CLUSTER_TESTS) \
            and not cluster.supported(launcher.device_limits()):
        pytest.skip("no thread-block clusters on this device")
DTYPES = ["float16", "bfloat16", "float32", "float64"]
REFS = {"softmax": R.softmax, "log_softmax": R.log_softmax,
        "logsumexp": lambda x: R.logsumexp(x)[..., None]}
TOL = {  # (softmax, log_softmax/logsumexp): output rounding plus fast exp/log
    "float16": (dict(rtol=2e-3, atol=2e-4), dict(rtol=2e-3, atol=2e-2)),
    "bfloat16": (dict(rtol=1e-2, atol=1e-3), dict(rtol=8e-3, atol=6e-2)),
    "float32": (dict(rtol=1e-4, atol=2e-6), dict(rtol=1e-5, atol=5e-5)),
    "float64": (dict(rtol=1e-12, atol=1e-13), dict(rtol=1e-12, atol=1e-12)),
}


# --- bfloat16 as uint16 bits (round to nearest even), and back -------------------------
def to_bf16(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((b >> 16) | 0x40).astype(np.uint16), r)


def from_bf16(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def stored(values, dtype):
    """(what the kernel gets: NumPy storage array, its exact values in float64)."""
    if dtype == "bfloat16":
        bits = to_bf16(values)
        return bits, from_bf16(bits).astype(np.float64)
    x = np.asarray(values).astype(dtype)
    return x, x.astype(np.float64)


def decoded(y, dtype):
    return (from_bf16(y) if dtype == "bfloat16" else y).astype(np.float64)


def width(dtype):
    return vector.width_for(np.uint16 if dtype == "bfloat16" else dtype)


def run(method, mode, x, dtype, *, view=None, out_view=None, **config):
    """Launch ``method`` on the storage array ``x`` (through ``view`` of the device copy
    if given) into a NaN-poisoned output; returns the output as float64 and checks
    the input was not touched."""
    d = cuda.to_device(np.ascontiguousarray(x))
    xd = view(d) if view else d
    rows, n = xd.shape
    shape = (rows, 1 if mode == "logsumexp" else n)
    poison = 0x7FC0 if dtype == "bfloat16" else np.nan
    yfull = cuda.to_device(np.full(shape if out_view is None else out_view[0], poison, xd.dtype))
    yd = out_view[1](yfull) if out_view else yfull
    if config:
        methods.KERNELS[method].launch(xd, yd, MODES[mode], **config)
    else:
        methods.launch(method, MODES[mode], xd, yd)
    np.testing.assert_array_equal(d.copy_to_host(), x)  # the input is never modified
    y = yfull.copy_to_host()
    if out_view is not None:  # what lies outside the view is still the poison
        outside = np.ones(y.shape, bool)
        out_view[1](outside)[...] = False
        assert np.isnan(decoded(y[outside], dtype)).all()
        y = out_view[1](y)
    return decoded(np.asarray(y), dtype)


def check(got, values, mode, dtype):
    want = REFS[mode](values)
    tol = TOL[dtype][0 if mode == "softmax" else 1]
    np.testing.assert_allclose(got, want, **tol)


# --- every method × dtype × mode -----------------------------------------------------------
def case(method, dtype):
    """(rows, n, launch config) that makes ``method`` cross two warps, two chunks (or
    pieces, or blocks) and a ragged end, one vector per thread per chunk."""
    w = width(dtype)
    chunk = T * w  # a team of 64 threads, one W-vector each
    if method == "group":  # two blocks hold one chunk each; the third chunk spills
        itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
        shared = (chunk + 2 * T) * itemsize
        return 1, 2 * chunk + 3, dict(vpt=w, threads=T, blocks=2, shared=shared)
    config = dict(vpt=w, threads=T)
    if method == "fused":  # one chunk by design: two vectors per thread hold the row
        config["vpt"] = None
    if method == "split":
        config["splits"] = 2
    if method == "onchip":
        config["shared"] = 4096
    if method == "cluster":  # two rows, each over a cluster of three blocks (the last ragged),
        return 2, 2 * chunk + 3, dict(vpt=w, threads=T, size=3, registers=False)  # parked
    return 1, chunk + 3, config


@pytest.mark.parametrize("mode", list(REFS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", list(methods.KERNELS))
def test_every_method_dtype_and_mode(method, dtype, mode):
    rows, n, config = case(method, dtype)
    rng = np.random.default_rng()
    values = rng.standard_normal((rows, n)) * 3
    values[0, [0, T - 1, T * width(dtype)]] = -np.inf  # −inf where warps and chunks meet
    x, exact = stored(values, dtype)
    check(run(method, mode, x, dtype, **config), exact, mode, dtype)


# --- widths at each threshold ----------------------------------------------------------------
def fits_or_refused(method, n, fits, view=None, **config):
    x = (np.random.default_rng().standard_normal((1, n)) * 3).astype(np.float32)
    if not fits:
        with pytest.raises(ValueError, match="on chip|shared memory"):
            run(method, "softmax", x, "float32", view=view, **config)
        return
    got = run(method, "softmax", x, "float32", view=view, **config)
    check(got, (view(x) if view else x).astype(np.float64), "softmax", "float32")


@pytest.mark.parametrize("n, fits", [(256, True), (257, True), (1024, True), (1025, True),
                                     (2048, True), (2049, False)])
def test_fused_at_its_thresholds(n, fits):
    """A warp per row up to 32 × 32 values (a values-per-thread step at 256/257), a
    team of two warps beyond (1024/1025), the limit 64 × 32 = 2048 with 64 threads."""
    fits_or_refused("fused", n, fits, max_threads=T)


@pytest.mark.parametrize("mode", list(REFS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_takes_a_team_of_whole_warps(dtype, mode, monkeypatch):
    """The default team is the fewest whole warps that hold the row at the most values a
    thread — three warps, not a power of two, for rows of 3·32·most − 5 values (so that
    more rows fit a multiprocessor, fused.fill); −inf where the warps meet, ragged end.
    (The simulator's blocks stop at 64 threads: here they may have 128.)"""
    monkeypatch.setattr(launcher, "max_threads", lambda kernel, args: 128)
    most = fused.max_vpt(32, np.float64 if dtype == "float64" else np.float32)
    n = 3 * 32 * most - 5
    values = np.random.default_rng().standard_normal((2, n)) * 3
    values[0, [0, 32 * most - 1, 64 * most]] = -np.inf
    x, exact = stored(values, dtype)
    xd = cuda.to_device(x)
    y = cuda.device_array((2, 1 if mode == "logsumexp" else n), xd.dtype)
    assert fused.configure(xd, y, MODES[mode]).team == 96
    check(run("fused", mode, x, dtype), exact, mode, dtype)


def test_fused_fill_counts_rows_a_multiprocessor_holds():
    """fill: blocks a multiprocessor (1024 threads) × n over 1024 × 32 float32 values."""
    assert fused.default_team(10240) == 320 and fused.default_team(10240, exact=False) == 512
    assert fused.default_team(16384) == 512 and fused.default_team(1000) == 32
    assert fused.fill(16384) == 1.0 and fused.fill(14336) == 0.875
    assert fused.fill(12288) == 0.75 and fused.fill(10240) == 0.9375
    assert fused.fill(8192, np.float64) == 1.0 and fused.fill(6144, np.float64) == 0.75


def test_fused_float32_softmax_takes_a_wider_team(monkeypatch):
    """Float32 softmax rows of 2049 … 12288 values: 8 or 16 values a thread in more warps,
    held to 32 or 40 registers (fused.WIDE), except rows of whole 1024-value pieces that
    are not a power of two; other lengths, modes and dtypes keep the default team; a
    device that does not take the wide team gets the default one."""
    monkeypatch.setattr(launcher, "max_threads", lambda kernel, args: 1024)

    def team(n, dtype=np.float32, mode="softmax"):
        x = cuda.device_array((1, n), dtype)
        y = cuda.device_array((1, 1 if mode == "logsumexp" else n), dtype)
        return fused.configure(x, y, MODES[mode]).team

    lengths = (2048, 2049, 3072, 4096, 4097, 8192, 10240, 12000, 12288, 12289, 16384)
    assert [team(n) for n in lengths] == [64, 288, 96, 512, 288, 512, 320, 768, 384, 416, 512]
    assert fused.wide_team(4096, np.float32, MODES["softmax"]) == (512, 32)
    assert fused.wide_team(8192, np.float32, MODES["softmax"]) == (512, 40)
    assert team(8192, mode="log_softmax") == team(8192, np.float16) == 256
    assert team(8192, np.float64) == 512
    monkeypatch.setattr(launcher, "max_threads", lambda kernel, args: 256)
    assert team(8192) == 256 and team(4096) == 128  # the default team, 32 values a thread


@pytest.mark.skipif(SIMULATOR, reason="GPU sizes: teams of up to 768 threads")
@pytest.mark.parametrize("n", [2049, 3067, 4096, 6150, 8192, 12000])
def test_fused_wide_teams_on_the_gpu(n):
    """The wide float32 teams (fused.WIDE) on ragged rows, contiguous and reversed (one
    value a vector), against the float64 reference; the plan is the wide one."""
    values = np.random.default_rng().standard_normal((37, n)) * 3
    x, exact = stored(values, "float32")
    xd = cuda.to_device(x)
    assert fused.configure(xd, xd, MODES["softmax"]).team == fused.wide_team(n, np.float32, MODES["softmax"])[0]
    check(run("fused", "softmax", x, "float32"), exact, "softmax", "float32")
    rev = lambda a: a[::-1, ::-1]  # noqa: E731
    check(run("fused", "softmax", x, "float32", view=rev), rev(exact), "softmax", "float32")


@pytest.mark.parametrize("n", [256, 257, 512, 513])
def test_online_at_its_thresholds(n):
    """A one-warp team up to 32 × 8 values, two warps beyond; one chunk up to 64 × 8,
    two beyond (the second re-read first)."""
    fits_or_refused("online", n, True, threads=T)


def test_onchip_at_its_limit():
    """A row of 6 values a thread needs a stride of 7 (one of padding): 7 × 64 × 4 bytes."""
    assert onchip.stride_for(6 * T, T, 1) == 7
    assert onchip.stride_for(7 * T + 1, T, 1) == 9
    strided = lambda d: d[:, ::-1]  # noqa: E731 — width 1: one value per thread a step
    need = 7 * T * 4
    fits_or_refused("onchip", 6 * T, False, threads=T, shared=need - 1, view=strided)
    fits_or_refused("onchip", 6 * T, True, threads=T, shared=need, view=strided)


# --- precision ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["online", "onchip"])
def test_long_float16_rows_accumulate_in_float32(method):
    """2500 values near the max: ℓ ≈ 2500, which float16 cannot count past 2048 (its
    spacing there is 2) — a float16 accumulator would give p about 20 % too large."""
    values = np.random.default_rng().standard_normal((1, 2500)) * 0.05
    x, exact = stored(values, "float16")
    check(run(method, "softmax", x, "float16", threads=T), exact, "softmax", "float16")


@pytest.mark.parametrize("method", list(methods.KERNELS))
def test_log_softmax_beyond_exp_underflow(method):
    """exp(−200) is 0 in float32: log(softmax) would give −inf where log_softmax is
    finite (x − m − log ℓ)."""
    values = np.random.default_rng().standard_normal((1, 70))
    values[0, 5:40] -= np.linspace(100, 3000, 35)
    x, exact = stored(values, "float32")
    got = run(method, "log_softmax", x, "float32")
    assert np.isfinite(got).all()
    check(got, exact, "log_softmax", "float32")


# --- special values, in negative-stride and stepped views ------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("method", list(methods.KERNELS))
def test_special_values_across_boundaries_in_strided_views(method, dtype):
    """Rows reversed and read backwards (negative strides: scalar loads), written into
    every other column of a wider output; −inf where warps and chunks meet, a row of
    −inf, NaN at the ragged end with +inf in another warp — softmax and logsumexp, and
    log_softmax for one kernel (its per-element formula is the epilogue every kernel
    shares; its row path is softmax's)."""
    if dtype == "bfloat16" and method != "online":
        pytest.skip("bfloat16 specials (its NaN and inf bits): one kernel suffices")
    rows, n, config = case(method, "float32")
    if method != "fused":
        config = dict(config, vpt=1)  # width 1 here: one value per thread a step
    rng = np.random.default_rng()
    values = rng.standard_normal((3, n)) * 3
    values[0, [T - 1, T, 2 * T - 1, 2 * T]] = -np.inf
    values[1] = -np.inf
    values[2, n - 1], values[2, T + 3] = np.nan, np.inf
    x, exact = stored(values, dtype)
    flip = lambda d: d[::-1, ::-1]  # noqa: E731
    for mode in ("softmax", "logsumexp") + (("log_softmax",) if method == "online" else ()):
        cols = 1 if mode == "logsumexp" else n
        out = ((3, 2 * cols), lambda a: a[:, ::2])
        got = run(method, mode, x[::-1, ::-1], dtype, view=flip, out_view=out, **config)
        check(got, exact, mode, dtype)


# --- the group's exchange ----------------------------------------------------------------
def test_group_of_three_blocks_with_rows_in_turn():
    """Three blocks per row, a single group taking three rows in turn (the alternating
    workspace slots), every block holding three units — a chunk and a half — and
    streaming a spilled share."""
    unit = T * 4
    rows, n = 3, 12 * unit + 4  # 9 units held; blocks 0 and 1 stream one more each
    shared = (3 * unit + 2 * T) * 4  # three units and the padding of each thread's stretch
    x = (np.random.default_rng().standard_normal((rows, n)) * 3).astype(np.float32)
    d = cuda.to_device(x)
    config = dict(threads=T, vpt=8, blocks=3, shared=shared)
    plan = group.configure(d, d, MODES["softmax"], **config)
    assert (plan.size, plan.groups, plan.piece, plan.spill) == (3, 1, 3 * unit, 2 * unit)
    check(run("group", "softmax", x, "float32", **config), x.astype(np.float64), "softmax",
          "float32")


def test_split_row_arithmetic():
    """Pure: the fewest blocks that hold a row, pieces in whole units, spill only past
    the chip, no more groups than rows."""
    # 8 rows of 10 units, 3 units a block, 12 blocks: 3 groups of 4 would take 3 waves of
    # 3 units, 2 groups of 5 take 4 waves of 2 — fewer units a block in all (8 < 9)
    assert group.split_row(8, 1000, 100, 300, 12) == (5, 2, 200, 0)
    size, groups, piece, spill = group.split_row(1, 10_000, 100, 300, 12)
    assert (size, groups, piece) == (12, 1, 300) and size * (piece + spill) >= 10_000
    assert group.split_row(1, 250, 100, 300, 12) == (3, 1, 100, 0)  # few rows: spread
    for rows, n in [(1, 1), (5, 7), (3, 999), (100, 20_000)]:
        size, groups, piece, spill = group.split_row(rows, n, 64, 640, 8)
        assert size * groups <= 8 and groups <= rows and piece % 64 == 0 and spill % 64 == 0
        assert size * (piece + spill) >= n and piece <= 640


def test_cooperative_blocks_meet_in_the_simulator():
    """The emulation: three blocks of a cooperative kernel run at once; a grid sync
    orders one block's write before another's read, and the group barrier does too,
    many times over (its counter only grows)."""
    from numba_softmax.runtime import sim
    from numba_softmax.kernels.hw import jit
    from numba_softmax.kernels.rows.sync import group_barrier

    @jit.kernel
    def ring(out, counters, rounds):
        cuda.cg.this_grid()
        b, t = cuda.blockIdx.x, cuda.threadIdx.x
        board = cuda.shared.array(1, np.int64)  # one per block, as on the GPU
        if t == 0:
            board[0] = b
        for r in range(rounds):
            if t == 0:
                out[r, b] = board[0] * 10 + r
            group_barrier(counters, 0, cuda.gridDim.x)
            if t == 0:
                board[0] = out[r, (b + 1) % cuda.gridDim.x] // 10  # the next block's
            cuda.cg.this_grid().sync()

    sim.cooperative(ring)
    out = cuda.to_device(np.zeros((4, 3), np.int64))
    counters = cuda.to_device(np.zeros(1, np.int64))
    launcher.launch(ring, 3, 32, 0, (out, counters, 4))
    got = out.copy_to_host()
    want = np.array([[(b + r) % 3 * 10 + r for b in range(3)] for r in range(4)])
    np.testing.assert_array_equal(got, want)
    assert counters.copy_to_host()[0] == 12


# --- launch configurations, host only ----------------------------------------------------
SHAPES = [(1, 1), (37, 7), (199, 760), (5, 1128), (3, 5000), (2, 70_000), (1, 300_000)]


@pytest.mark.parametrize("module, dtype, rows, n, team", [
    ("online", np.float32, 132, 8192, 256),  # rows fill the device: 16 values, 128 B a thread
    ("online", np.float32, 132, 1024, 32),  # … a warp a row, two chunks
    ("online", np.float16, 132, 8192, 128),  # … 16-bit: four chunks
    ("online", np.float32, 131, 8192, 1024),  # fewer rows than multiprocessors: one chunk
    ("online", np.float64, 132, 8192, 1024),  # float64: one chunk of 2 vectors a thread
    ("three_pass", np.float32, 132, 16384, 512),  # rows of ≤ 64 KB: two chunks a team
    ("three_pass", np.float32, 132, 16388, 1024),  # longer: one chunk (the block limit)
    ("three_pass", np.float16, 131, 1024, 64),  # few rows: one chunk of 16 values
])
def test_streaming_teams_narrow_where_rows_fill_the_device(monkeypatch, module, dtype, rows, n, team):
    """online and three_pass give a row a narrower team (more rows to a block) only where
    there is a row for every multiprocessor (H200: online float32 4096 × 8192 45 → 87 % of
    copy; with 37 rows it lost), and the team still covers the row."""
    from numba_softmax.kernels.softmax import online, three_pass

    limits = launcher.Limits("an H200", sms=132, max_threads=1024, shared_optin=232448,
                             shared_per_sm=233472, l2_bytes=60 << 20, cc=(9, 0))
    monkeypatch.setattr(launcher, "device_limits", lambda: limits)
    monkeypatch.setattr(launcher, "max_threads", lambda k, a: 1024)
    x = cuda.device_array((rows, n), dtype)
    plan = {"online": online, "three_pass": three_pass}[module].configure(x, x, MODES["softmax"])
    assert plan.team == team, plan
    assert plan.block % plan.team == 0 and plan.grid * (plan.block // plan.team) >= rows
    assert plan.block >= 256


@pytest.mark.parametrize("limit", [256, 96])
def test_no_launch_exceeds_the_kernels_thread_limit(monkeypatch, limit):
    """With ``max_threads`` mocked to return ``limit`` (a kernel whose registers allow
    only that many), every method × dtype × shape launches blocks of at most that many
    threads (a power of two: teams divide blocks — fused: whole warps, a team a block),
    grids that cover every row, and a cooperative grid no larger than the device holds
    at once."""
    launches = []
    limits = launcher.Limits("an H100", sms=132, max_threads=1024, shared_optin=232448,
                             shared_per_sm=233472, l2_bytes=50 << 20, cc=(9, 0))
    monkeypatch.setattr(launcher, "device_limits", lambda: limits)
    monkeypatch.setattr(launcher, "max_threads", lambda k, a: limit)
    monkeypatch.setattr(launcher, "max_cooperative_blocks", lambda k, a, b, s=0: 10)
    monkeypatch.setattr(launcher, "launch", lambda k, g, b, s, a, shared=0, cluster=1:
                        launches.append((k, g, b, a, shared, cluster)))
    for dtype in (np.float16, np.uint16, np.float32, np.float64):
        for rows, n in SHAPES:
            x = cuda.device_array((rows, n), dtype)
            for mode in (0, 2):
                y = cuda.device_array((rows, n if mode != LOGSUMEXP else 1), dtype)
                for method in methods.KERNELS:
                    launches.clear()
                    try:
                        methods.launch(method, mode, x, y)
                    except ValueError as e:  # a row too long for fused / onchip / cluster
                        assert method in ("fused", "onchip", "cluster"), (method, e)
                        assert "chip" in str(e) or "shared memory" in str(e)
                        continue
                    assert launches, method
                    for k, grid, block, args, shared, size in launches:
                        whole = block % 32 == 0 if method == "fused" else block & (block - 1) == 0
                        assert block <= limit and whole, (method, block)
                        assert shared <= limits.shared_optin
                        if method in ("three_pass", "online"):
                            team = args[2]
                            assert block % team == 0 and grid * (block // team) >= rows
                        if method == "group":
                            assert grid <= 10 and grid % args[2] == 0  # whole groups
                        if method == "cluster":  # whole clusters, one a row, pieces cover it
                            assert grid == rows * size and size * args[2] >= n
                            assert 1 <= size <= cluster.MAX_SIZE


def test_auto_chooses_by_row_bytes():
    lim = launcher.Limits("some GPU", sms=100, max_threads=1024, shared_optin=227 * 1024,
                          shared_per_sm=228 * 1024, l2_bytes=50 << 20)
    assert methods.choose(1000, 8192, np.float32, lim) == "fused"
    assert methods.choose(1000, 6144, np.float32, lim) == "fused"  # within 32 KB
    assert methods.choose(1000, 16384, np.float32, lim) == "fused"  # its registers full
    assert methods.choose(1000, 14336, np.float32, lim) == "fused"  # 87.5 % full
    assert methods.choose(1000, 12288, np.float32, lim) == "onchip"  # 75 %
    assert methods.choose(1000, 10240, np.float32, lim) == "fused"  # 3 blocks of 320: 94 %
    assert methods.choose(1000, 9216, np.float32, lim) == "fused"  # 3 blocks of 288: 84 %
    assert methods.choose(1000, 6144, np.float64, lim) == "fused"  # within 48 KB
    assert methods.choose(1000, 16384, np.float16, lim) == "fused"
    assert methods.choose(1000, 8192, np.float64, lim) == "fused"
    assert methods.choose(1000, 24576, np.float32, lim) == "onchip"  # 96 KB
    assert methods.choose(10, 12288, np.float32, lim) == "onchip"  # few rows, one block holds it
    assert methods.choose(10, 65536, np.float32, lim) == "group"  # too long for that
    assert methods.choose(1000, 65536, np.float32, lim) == "group"  # no clusters (cc 0.0)
    assert methods.choose(1000, 12288, np.float16, lim) == "onchip"  # 16-bit: no onchip entry
    assert fused.fill(14336) == 0.875 and fused.fill(12288) == 0.75
    hopper = lim._replace(cc=(9, 0))
    assert methods.choose(1000, 65536, np.float32, hopper) == "cluster"  # 8 blocks a row
    assert methods.choose(1000, 262144, np.float32, hopper) == "cluster"  # 8 blocks' registers
    assert methods.choose(1000, 262145, np.float32, hopper) == "group"  # past them and 512 KB
    assert methods.choose(20, 65536, np.float32, hopper) == "group"  # 160 blocks < 2 × 100 SMs
    assert methods.choose(75, 1 << 20, np.float16, hopper) == "online"  # 16-bit, rows ≥ ¾ SMs
    assert methods.choose(74, 1 << 20, np.float16, hopper) == "group"
    assert methods.choose(128, 1 << 20, np.float32, hopper) == "group"  # float32: group ties
    assert methods.choose(10, 12288, np.float32, hopper) == "cluster"  # few short rows
    assert methods.choose(1000, 24576, np.float32, hopper) == "onchip"
    assert methods.choose(1000, 32768, np.float32, hopper) == "cluster"  # past 96 KB
    assert methods.choose(1000, 12288, np.float16, hopper) == "cluster"
    assert methods.choose(1000, 10240, np.float16, hopper) == "fused"  # 94 % full


def test_fitting_the_crossovers_runs_the_rule_itself():
    """fit_crossovers keeps the entry under which ``choose`` picks the fastest measured
    kernels: here onchip must stop between 48 and 96 KB (cluster wins at 96 KB); fused
    may be 0 or 32 KB (8192 values fill its registers either way) and cluster anything
    (its registers hold 256 KB): those stay as they were."""
    hopper = launcher.Limits("some GPU", sms=100, max_threads=1024, shared_optin=227 * 1024,
                             shared_per_sm=228 * 1024, l2_bytes=50 << 20, cc=(9, 0))
    rates = [(8192, "fused", 9), (8192, "onchip", 8), (12288, "onchip", 9), (12288, "fused", 8),
             (12288, "cluster", 7), (24576, "cluster", 9), (24576, "onchip", 8),
             (65536, "cluster", 9), (65536, "group", 8)]
    entries = methods.fit_crossovers(
        [dict(n=n, itemsize=4, rows=1000, method=m, gbps=g) for n, m, g in rates], hopper)
    before, _ = crossover_table.entry(hopper, 4)
    assert entries == {"4": {"fused": 32768, "onchip": 49152, "cluster": 524288, "score": 1.0,
                             "cases": 4, "before": before, "source": "default",
                             "before_score": round((3 + 8 / 9) / 4, 4)}}
    # (the default entry keeps onchip at 96 KB: 8/9 of the best there)


def test_the_shipped_crossover_table(tmp_path, monkeypatch):
    """crossovers.json: every device's entry names the three thresholds for each item
    size; the H100's own entry (bench --crossovers on it) is the one an H100 gets."""
    monkeypatch.setenv(crossover_table.ENV, str(tmp_path / "none.json"))  # no user's table
    crossover_table.table.cache_clear()
    try:
        shipped = crossover_table.table()
        assert "default" in shipped and shipped["default"]["shared_per_sm"] > 0
        for name, sizes in shipped.items():
            if not name.startswith("_"):
                for size in ("2", "4", "8"):
                    assert set(crossover_table.KEYS) <= set(sizes[size]), (name, size)
        h100 = launcher.Limits("NVIDIA H100 80GB HBM3", sms=132, max_threads=1024,
                               shared_optin=227 * 1024, shared_per_sm=228 * 1024,
                               l2_bytes=50 << 20, cc=(9, 0))
        assert crossover_table.entry(h100, 2) == (
            {"fused": 24576, "onchip": 98304, "cluster": 524288}, "measured")
        assert methods.choose(528, 32768, np.float16, h100) == "onchip"  # 64 KB 16-bit rows
        assert methods.choose(528, 32768, np.float16, h100._replace(name="an H200")) == "cluster"
    finally:
        crossover_table.table.cache_clear()


def test_the_users_crossovers_replace_the_shipped_ones(tmp_path, monkeypatch):
    """save_crossovers writes this machine's table (NUMBA_SOFTMAX_CROSSOVERS here), whose
    entry then replaces the default for that device and item size only; a broken file or
    entry is a clear error naming it."""
    path = tmp_path / "crossovers.json"
    monkeypatch.setenv(crossover_table.ENV, str(path))
    crossover_table.table.cache_clear()
    lim = launcher.Limits("my GPU", sms=100, max_threads=1024, shared_optin=227 * 1024,
                          shared_per_sm=228 * 1024, l2_bytes=50 << 20)
    try:
        assert crossover_table.entry(lim, 4)[1] == "default"
        assert methods.choose(1000, 12288, np.float32, lim) == "onchip"
        mine = {"fused": 1 << 20, "onchip": 0, "cluster": 0}
        assert methods.save_crossovers("my GPU", {"4": dict(mine, score=0.99)}) == str(path)
        assert crossover_table.entry(lim, 4) == (mine, "measured")
        assert crossover_table.entry(lim, 2)[1] == "default"  # other item sizes: as shipped
        assert crossover_table.entry(lim._replace(name="other GPU"), 4)[1] == "default"
        assert methods.choose(1000, 12288, np.float32, lim) == "fused"
        path.write_text('{"my GPU": {"4": {"fused": 1}}}')
        crossover_table.table.cache_clear()
        with pytest.raises(ValueError, match="needs integers fused, onchip, cluster"):
            methods.choose(1000, 12288, np.float32, lim)
        path.write_text("{not json")
        crossover_table.table.cache_clear()
        with pytest.raises(ValueError, match="crossovers.json"):
            methods.choose(1000, 12288, np.float32, lim)
    finally:
        monkeypatch.delenv(crossover_table.ENV)
        crossover_table.table.cache_clear()


@pytest.mark.parametrize("mode", list(REFS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_cluster_pieces_in_registers(dtype, mode):
    """The cluster's other form: each block holds its piece in registers (two values a
    thread here), two rows over three blocks, the last piece ragged."""
    w = width(dtype)
    values = np.random.default_rng().standard_normal((2, 4 * T * w + 3)) * 3
    values[0, [0, T - 1, T * w]] = -np.inf
    x, exact = stored(values, dtype)
    xd = cuda.to_device(x)
    config = dict(threads=T, size=3, vpt=2 * w, registers=True)
    plan = cluster.configure(xd, xd, MODES[mode], **config)
    assert mode == "logsumexp" or plan.shared == 0  # registers (logsumexp streams its piece)
    check(run("cluster", mode, x, dtype, **config), exact, mode, dtype)


@pytest.mark.parametrize("mode", list(REFS))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cluster_parks_16_bit_rows_in_pairs(dtype, mode):
    """16-bit rows of 16-byte vectors: the cluster's blocks park their pieces as the
    vectors' 32-bit words, two values a word (the arrays passed as uint16 bits); two rows
    over three blocks, the last piece five vectors long."""
    values = np.random.default_rng().standard_normal((2, 2 * T * 8 + 40)) * 3
    values[0, [0, T - 1, T * 8, 2 * T * 8 + 39]] = -np.inf
    x, exact = stored(values, dtype)
    xd = cuda.to_device(x)
    config = dict(threads=T, size=3, vpt=16, registers=False)
    plan = cluster.configure(xd, xd, MODES[mode], **config)
    assert plan.bits == (mode != "logsumexp")
    check(run("cluster", mode, x, dtype, **config), exact, mode, dtype)


def test_pad_bits_and_bit_views():
    """Pure: the 16-bit pad a row held in pairs ends with (its stored bits), and the
    uint16 views a kernel holding pairs takes (float16 viewed, the others as they are)."""
    from numba_softmax.kernels.rows import pairs

    assert pairs.pad_bits(np.float16, -np.inf) == 0xFC00
    assert pairs.pad_bits(np.float16, 0.0) == 0
    assert pairs.pad_bits(np.uint16, -np.inf) == 0xFF80  # bfloat16 (its uint16 bits)
    assert pairs.pad_bits(np.uint16, np.inf) == 0x7F80
    assert from_bf16(np.array([pairs.pad_bits(np.uint16, -2.0)], np.uint16))[0] == -2.0
    h = cuda.to_device(np.ones((2, 8), np.float16))
    b = cuda.to_device(np.ones((2, 8), np.uint16))
    f = cuda.to_device(np.ones((2, 8), np.float32))
    hv, bv, fv = pairs.bits(h, b, f)
    assert (hv.dtype, bv.dtype, fv.dtype) == (np.uint16, np.uint16, np.float32)
    assert (hv.copy_to_host() == np.float16(1).view(np.uint16)).all()  # the same bytes


@pytest.mark.parametrize("mode", list(REFS))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("threads, n", [(32, 8 * 32 * 3 - 8), (64, 8 * 64 * 2 - 16)])
def test_fused_holds_16_bit_rows_in_pairs(dtype, mode, threads, n):
    """float16 / bfloat16 rows of 16-byte vectors: the fused kernel holds them two to a
    register (its arrays passed as uint16 bits); the team's last vectors lie past the row
    (padded by −inf: they weigh nothing); a row of −inf gives the reference's NaN (−inf
    for logsumexp); the same rows held one value a register (``pack=False``) give the
    same bits — but softmax, where the pairs keep their float32 exps and the output is
    exp(v − m_t)·exp(m_t − m)/ℓ, rounds one way or the other: within one unit in the
    last place (below 2⁻¹⁴, float16's subnormals, an absolute 2⁻²⁴)."""
    values = np.random.default_rng().standard_normal((3, n)) * 4
    values[1, :] = -np.inf  # every value −inf
    values[2, ::7] = -np.inf
    x, exact = stored(values, dtype)
    xd = cuda.to_device(x)
    y = cuda.device_array((3, 1 if mode == "logsumexp" else n), xd.dtype)
    plan = fused.configure(xd, y, MODES[mode], threads=threads)
    assert plan.team == threads and plan.args[0].dtype == np.uint16  # held as bits
    got = run("fused", mode, x, dtype, threads=threads)
    with np.errstate(invalid="ignore"):
        check(got, exact, mode, dtype)  # (the reference's row of −inf: NaN, or −inf)
    unpacked = run("fused", mode, x, dtype, threads=threads, pack=False)
    if mode == "softmax":  # one unit in the last place: 2⁻¹⁰ (float16), 2⁻⁷ (bfloat16)
        ulp = 2.0 ** (-10 if dtype == "float16" else -7)  # relative, for normal values
        tiny = 2.0 ** (-24 if dtype == "float16" else -133)  # a subnormal's unit, absolute
        np.testing.assert_allclose(got, unpacked, rtol=ulp, atol=tiny)
    else:
        np.testing.assert_array_equal(got, unpacked)


def test_register_cut():
    """Pure: the most threads (the fewest blocks) whose at most 8 blocks of 32 float32
    values (16 float64) a thread hold the row with every thread full, else the fewest
    threads; None past that."""
    assert cluster.register_cut(65536, np.float32, 4, 1024) == (2, 1024, 32)  # fewest blocks
    assert cluster.register_cut(262144, np.float32, 4, 1024) == (8, 1024, 32)
    assert cluster.register_cut(20000, np.float32, 4, 1024) == (1, 1024, 32)
    assert cluster.register_cut(20000, np.float32, 4, 256) == (3, 256, 32)
    assert cluster.register_cut(8192, np.float32, 4, 1024) == (1, 256, 32)  # full threads
    assert cluster.register_cut(8192, np.float32, 4, 1024, size=8) == (8, 256, 4)  # none full
    assert cluster.register_cut(262145, np.float32, 4, 1024) is None
    assert cluster.register_cut(262144, np.float32, 4, 512) is None  # the device's threads
    assert cluster.register_cut(65536, np.float64, 2, 1024) == (4, 1024, 16)
    assert cluster.register_cut(1000, np.float32, 4, 1024, threads=64, size=3) == (3, 64, 8)


def test_cluster_cut_and_refusals():
    """Pure: pieces of whole units within 32 KB, at most 8 blocks; threads one per 32
    float32-sized values; no clusters before sm_90; a piece past the shared memory."""
    assert cluster.cut(65536, 4, 1024) == (8, 8192)
    assert cluster.cut(16384, 4, 1024) == (2, 8192)
    assert cluster.cut(262144, 4, 1024) == (8, 32768)  # capped at 8: 128 KB pieces
    assert cluster.cut(1000, 4, 256, size=3) == (3, 512)
    assert cluster.threads_for(8192, 4, 1024) == 256 and cluster.threads_for(16384, 4, 1024) == 512
    assert cluster.threads_for(16384, 2, 1024) == 256 and cluster.threads_for(8192, 4, 128) == 128
    assert cluster.threads_for(32768, 2, 1024) == 256  # 16-bit: 256 bytes a thread
    assert cluster.threads_for(131072, 2, 1024) == 1024
    x = cuda.device_array((2, 1000), np.float32)
    if not cluster.supported(launcher.device_limits()):  # before sm_90
        with pytest.raises(ValueError, match="needs thread-block clusters"):
            cluster.launch(x, x, MODES["softmax"])
        return
    with pytest.raises(ValueError, match="size must be"):
        cluster.launch(x, x, MODES["softmax"], size=9)
    with pytest.raises(ValueError, match="shared memory"):
        cluster.launch(x, x, MODES["softmax"], threads=T, size=2, shared=100, registers=False)
    with pytest.raises(ValueError, match="registers"):
        cluster.launch(x, x, MODES["softmax"], threads=T, size=2, vpt=4, registers=True)


def test_cluster_holds_float32_rows_in_registers_where_they_make_waves(monkeypatch):
    """float32 rows go to registers in the fewest blocks (1024 threads) where the rows
    give 8 waves of those blocks; fewer rows, and 16-bit rows, park in shared memory."""
    limits = launcher.Limits("a small sm_90", sms=4, max_threads=1024, shared_optin=232448,
                             shared_per_sm=233472, l2_bytes=50 << 20, cc=(9, 0))
    monkeypatch.setattr(launcher, "device_limits", lambda: limits)
    monkeypatch.setattr(launcher, "max_threads", lambda k, a: 1024)
    many = cuda.device_array((16, 65536), np.float32)
    few = cuda.device_array((15, 65536), np.float32)
    plan = cluster.configure(many, many, MODES["softmax"])
    assert (plan.size, plan.threads, plan.shared) == (2, 1024, 0)  # 16 rows × 2 = 8 waves of 4
    plan = cluster.configure(few, few, MODES["softmax"])
    assert plan.shared > 0 and plan.size == 8  # 30 blocks: parked, 8 blocks a row
    half = cuda.device_array((16, 65536), np.float16)
    assert cluster.configure(half, half, MODES["softmax"]).shared > 0
    short = cuda.device_array((64, 8192), np.float32)  # 8 values a thread of 1024: parked
    assert cluster.configure(short, short, MODES["softmax"]).shared > 0


def test_bad_arguments_are_refused():
    x = cuda.device_array((2, 3), np.float32)
    with pytest.raises(ValueError, match="method"):
        methods.launch("magic", 0, x, x)
    with pytest.raises(ValueError, match=r"\(2, 1\)"):
        methods.launch("online", LOGSUMEXP, x, x)
    with pytest.raises(TypeError, match="float32"):
        methods.launch("online", 0, x, cuda.device_array((2, 3), np.float64))
    with pytest.raises(TypeError, match="int32"):
        methods.launch("online", 0, cuda.device_array((2, 3), np.int32), x)


@pytest.mark.skipif(SIMULATOR, reason="the GPU's own launch limits (the matrix above runs here)")
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", list(methods.KERNELS))
def test_default_launch_on_the_gpu(method, dtype, layout):
    """Every method × dtype × layout with the launch it chooses itself — the block sizes
    the compiled kernel allows (a float64 kernel launched with 1024 threads failed with
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, issue 11) — for every mode."""
    values = np.random.default_rng().standard_normal((37, 2 * 1128)) * 3
    x, exact = stored(values, dtype)
    view = (lambda a: a[::-1, ::2]) if layout == "strided" else (lambda a: a[:, :1128])
    for mode in REFS:
        check(run(method, mode, x, dtype, view=view), view(exact), mode, dtype)


@pytest.mark.skipif(SIMULATOR, reason="GPU sizes: the whole chip")
@pytest.mark.parametrize("n", [16384, 65536, 1 << 20])
def test_long_rows_on_the_gpu(n):
    rows = sized(1, max(1, (1 << 22) // n))
    x = np.random.default_rng().standard_normal((rows, n)).astype(np.float32)
    lim = launcher.device_limits()
    for method in ("onchip", "group", "online", "split", "cluster"):
        if method == "onchip" and n * 4 > lim.shared_optin - 1024:
            continue
        if method == "cluster" and (not cluster.supported(lim) or n > 1 << 17):
            continue
        check(run(method, "softmax", x, "float32"), x.astype(np.float64), "softmax", "float32")


@pytest.mark.skipif(SIMULATOR, reason="GPU sizes: clusters of 2 … 8 blocks")
@pytest.mark.parametrize("registers", [True, False])
@pytest.mark.parametrize("size", [2, 3, 5, 8])
def test_cluster_sizes_on_the_gpu(size, registers):
    """37 ragged rows of 60 001 values over clusters of every kind of size (the last
    block's piece short), float32 and bfloat16, softmax and logsumexp; pieces in
    registers (where they fit) and in shared memory."""
    if not cluster.supported(launcher.device_limits()):
        pytest.skip("no thread-block clusters on this device")
    values = np.random.default_rng().standard_normal((37, 60_001)) * 3
    for dtype in ("float32", "bfloat16"):
        x, exact = stored(values, dtype)
        for mode in ("softmax", "logsumexp"):
            check(run("cluster", mode, x, dtype, size=size, registers=registers), exact, mode,
                  dtype)


def test_traffic_models():
    h100 = launcher.Limits("an H100", sms=132, max_threads=1024, shared_optin=232448,
                           shared_per_sm=233472, l2_bytes=50 << 20)
    assert methods.traffic("fused", 3, 10, 4) == 240
    assert methods.traffic("three_pass", 3, 10, 4) == 480
    assert math.isclose(methods.traffic("online", 1, 1, 2), 6)
    # 1 × 16M float32: 528 blocks hold 13 312 values each (52 KB); the rest is read twice
    held = 528 * 13312
    assert group.held_per_row(1, 1 << 24, 4, h100) == held
    assert methods.traffic("group", 1, 1 << 24, 4, h100) == (2 * (1 << 24) + (1 << 24) - held) * 4
    assert methods.traffic("group", 128, 1 << 20, 4, h100) == 2 * 128 * (1 << 20) * 4
