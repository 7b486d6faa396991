"""The benchmark: its models and helpers, the sanity check, the sections, one --sim-smoke run."""

import contextlib
import csv
import importlib
import importlib.util
import py_compile
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

from _helpers import SIMULATOR
from numba_softmax import bench
from numba_softmax import reference as R
from numba_softmax.bench import attention as battn
from numba_softmax.bench import cli, report, results, targets, timing
from numba_softmax.bench.results import Bounds, ImpossibleFigure, Result


# --- models and helpers ------------------------------------------------------------------
def test_byte_and_flop_models():
    assert results.softmax_bytes(16384, 1024, 4) == 2 * 16384 * 1024 * 4 == 128 * 2**20
    assert results.attention_flops(2, 3, 5, 7, 11) == 4 * 2 * 3 * 5 * 7 * 11
    assert results.attention_flops(2, 3, 5, 7, 11, causal=True) == 2 * 2 * 3 * 5 * 7 * 11
    # q, o: Sq rows of Hq heads; k, v: Sk rows of Hkv heads
    assert results.attention_bytes(1, 2, 1, 100, 8, 2) == 2 * (2 * 1 + 2 * 100) * 8 * 2
    assert results.attention_bytes(1, 4, 1, 100, 8, 2, h_kv=1) == (2 * 4 + 2 * 100) * 8 * 2


def test_method_traffic_is_each_methods_own_bound():
    assert [results.method_traffic(m) for m in ("three_pass", "online", "split", "fused")] == \
        [4, 3, 3, 2]
    assert results.method_traffic("no such method") is None


def test_median_gbps_sets_and_reps():
    assert timing.median([3.0, 1.0, 2.0]) == 2.0 and timing.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        timing.median([])
    assert results.gbps(2e9, 1000.0) == pytest.approx(2.0)
    mib = 2**20
    assert timing.buffer_sets(256 * mib, 50 * mib, 80 * 2**30) == 2  # large: two suffice
    assert timing.buffer_sets(10 * mib, 50 * mib, 80 * 2**30) == 15  # span 3 × L2
    assert timing.buffer_sets(1024, 50 * mib, 80 * 2**30) == 64  # capped
    assert timing.buffer_sets(4 * 2**30, 50 * mib, 6 * 2**30) == 1  # memory-bound
    assert timing.choose_reps(1e-5, 20, 100, 0.3, 5.0) == (100, "")  # fast: capped above
    assert timing.choose_reps(0.01, 20, 100, 0.3, 5.0) == (30, "")  # about target_s of work
    reps, note = timing.choose_reps(1.0, 20, 100, 0.3, 5.0)  # too slow for min_reps
    assert reps == 5 and "slow" in note


def test_decode_splits():
    assert battn.decode_splits(16, 132, 16384) == 32  # >= 2 blocks per SM, a power of 2
    assert battn.decode_splits(1, 4, 64) == 2  # no split under 64 keys, but at least 2


def _row(**kw):
    base = dict(suite="softmax", impl="fused", level="kernel", array="numba", dtype="float32",
                median_ms=1.0, min_ms=0.9, reps=20, M=4, N=1024)
    base.update(kw)
    return Result(**base)


def test_derive_fills_rates_bounds_and_ratio_to_torch():
    ours = _row(bytes=4 * 10**9, model_bytes=6 * 10**9)
    torch_row = _row(impl="torch", median_ms=2.0, bytes=4 * 10**9)
    other = _row(N=2048, bytes=10**9)
    attn = _row(suite="attention", impl="numba_softmax", M=None, N=None, B=1, H=1, Sq=8,
                Sk=8, D=8, causal=True, flops=2 * 10**12, median_ms=1000.0)
    decode = _row(suite="decode", impl="split-KV", bytes=4 * 10**9, bound="read")
    bounds = Bounds(copy_gbps=8000.0, read_gbps=10000.0, tflops={"float32": 4.0})
    results.derive([ours, torch_row, other, attn, decode], bounds)
    assert ours.gbps == pytest.approx(4000.0) and ours.pct_copy == pytest.approx(50.0)
    assert ours.bound == "copy" and ours.pct_bound == pytest.approx(50.0)
    assert ours.pct_model == pytest.approx(75.0)  # 6 GB in 1 ms of an 8000 GB/s copy
    assert ours.x_torch == pytest.approx(2.0) and torch_row.x_torch == pytest.approx(1.0)
    assert other.x_torch is None  # no torch row of that shape
    assert attn.tflops == pytest.approx(2.0) and attn.bound == "peak"
    assert attn.pct_bound == pytest.approx(50.0)
    assert decode.pct_bound == pytest.approx(40.0)  # of the read stream, not of copy


def test_softmax_backward_rows_are_held_to_their_own_torch_backward():
    """One shape, two functions, two torch peers: each row divides by its own."""
    kw = dict(suite="backward", bytes=3 * 10**9)
    sm, lsm = _row(impl="softmax_backward", **kw), _row(impl="log_softmax_backward", **kw)
    t_sm = _row(impl="torch.softmax_backward", median_ms=4.0, **kw)
    t_lsm = _row(impl="torch.log_softmax_backward", median_ms=2.0, **kw)
    results.derive([sm, t_sm, lsm, t_lsm], Bounds(copy_gbps=8000.0))
    assert sm.x_torch == pytest.approx(4.0) and lsm.x_torch == pytest.approx(2.0)
    assert t_sm.x_torch == pytest.approx(1.0) and t_lsm.x_torch == pytest.approx(1.0)


def test_targets_judge_the_best_method_its_peers_and_the_worst_row():
    """The softmax targets: the fastest of our methods per problem, against the copy and
    every peer; a target is met only if all its rows pass, and names its worst row."""
    m, n = 16, 2**20  # 16 × 1M and 32 × 512K float32: 64 MB problems
    kw = dict(M=m, N=n, bytes=2 * m * n * 4)
    rows = [_row(impl="fused", median_ms=0.05, model_bytes=2 * m * n * 4, **kw),
            _row(impl="online", median_ms=0.06, model_bytes=3 * m * n * 4, **kw),
            _row(impl="torch", median_ms=0.10, **kw),
            _row(impl="triton tutorial", median_ms=0.055, **kw)]
    kw.update(M=2 * m, N=n // 2)
    rows += [_row(impl="fused", median_ms=0.08, model_bytes=2 * m * n * 4, **kw),
             _row(impl="triton seed001", median_ms=0.07, **kw),
             _row(impl="copy (same bytes)", median_ms=0.047, **kw)]  # a peer of no target
    results.derive(rows, Bounds(copy_gbps=3000.0))  # 0.05 ms: 2684 GB/s = 89.5 %
    got = {v.target: v for v in targets.softmax(rows)}
    best = got["softmax float32, 32 MB … 128 × 1M: fastest method ≥ 90 % of copy bandwidth"]
    assert (best.status, best.passed) == ("MISSED", "0/2")
    assert best.worst == "float32 32x524288: 55.9 % (a copy of its bytes: 95.2 %)"
    peers = got["softmax, every shape: fastest method ≥ every peer's speed "
                "(torch, triton tutorial, triton seed001)"]
    assert peers.status == "MISSED" and peers.passed == "1/2"
    assert "against triton seed001" in peers.worst and "0.875" in peers.worst
    geomean = "softmax, geometric mean over the problems: fastest method ≥ 1.5× torch's speed"
    assert got[geomean].status == "met"  # 2× torch, its one problem
    assert got["softmax float32 1 × 16M: fastest method ≥ 75 % of copy bandwidth"].status == \
        "not measured"
    own = got["softmax online, every shape: ≥ 85 % of its own traffic bound"]
    assert own.status == "met" and own.passed == "1/1"  # 3 passes in 0.06 ms: 112 %


def test_attention_targets_read_sdpa_and_the_triton_peer_of_the_same_problem():
    """The forward's targets: × SDPA from the derived ratio, × Triton against the peer row
    of the same (dtype, B, H, S, D, causal); float32 and S 1024 rows hold no target."""
    kw = dict(suite="attention", M=None, N=None, B=4, H=8, Sq=4096, Sk=4096, D=64,
              flops=10**12)
    rows = []
    for causal, mine, sdpa, triton in ((False, 1.0, 0.9, 1.1), (True, 0.6, 0.45, 0.5)):
        rows += [_row(impl="numba_softmax", dtype="float16", causal=causal, median_ms=mine, **kw),
                 _row(impl="torch.sdpa", dtype="float16", causal=causal, median_ms=sdpa, **kw),
                 _row(impl="triton", dtype="float16", causal=causal, median_ms=triton, **kw)]
    rows += [_row(impl="numba_softmax", dtype="float32", causal=False, median_ms=9.0, **kw),
             _row(impl="torch.sdpa", dtype="float32", causal=False, median_ms=1.0, **kw)]
    results.derive(rows, Bounds(copy_gbps=3000.0))
    got = {v.target: v for v in targets.attention(rows)}
    first, bar, peer = (got[f"attention forward fp16/bf16, S 4096 and 16384: {t}"] for t in
                        ("≥ 0.6× SDPA's speed (first bar)", "≥ 0.8× SDPA's speed",
                         "≥ the Triton peer's speed"))
    assert (first.status, first.passed) == ("met", "2/2")  # 0.9× and 0.75×; float32 left out
    assert (bar.status, bar.passed) == ("MISSED", "1/2") and "causal: 0.75× SDPA" in bar.worst
    assert (peer.status, peer.passed) == ("MISSED", "1/2") and "0.833× triton" in peer.worst
    assert targets.attention([r for r in rows if r.impl != "triton"])[2].status == "not measured"


def test_targets_at_most_and_the_table():
    """A ceiling (top-k's ≤ 20 µs at B 1) fails above it; the table names each target by
    what it measures (no issue numbers) and its worst row."""
    fast = _row(suite="topk", impl="softmax_topk", M=1, N=128256, k=8, median_ms=0.0157)
    slow = _row(suite="topk", impl="softmax_topk", M=1, N=128256, k=50, median_ms=0.0212)
    verdicts = [v for v in targets.topk([fast, slow]) if "µs" in v.target]
    assert verdicts[0].status == "MISSED" and "k50: 21.2 µs" in verdicts[0].worst
    assert targets.topk([fast])[2].status == "met"
    text = targets.format_targets(verdicts)
    assert "== targets ==" in text and "docs/targets.md" in text
    line = next(ln for ln in text.splitlines() if "µs" in ln)
    assert line.startswith("softmax + top-k B 1, V 128256: ≤ 20 µs") and "MISSED" in line
    assert "#" not in text and "issue" not in text.lower()
    every = targets.evaluate([_row(suite=s) for s in ("softmax", "attention", "backward", "decode",
                                                      "topk")])
    assert len(every) == 24 and all(v.status == "not measured" for v in every)
    assert all(v.target.startswith(("softmax", "attention", "paged")) for v in every)
    assert len({v.target for v in every}) == len(every)  # no two targets share a name
    assert targets.format_targets([]) == ""
    assert targets.evaluate([fast]) == targets.topk([fast])  # only the sections that ran


@pytest.mark.parametrize("row, bounds, says", [
    (_row(bytes=10**9, median_ms=0.1), Bounds(copy_gbps=9000.0), "of the device-to-device copy"),
    (_row(suite="decode", bytes=10**9, median_ms=0.1, bound="read"),
     Bounds(copy_gbps=5000.0, read_gbps=9000.0), "read-only stream"),
    (_row(bytes=10**9, median_ms=0.1), Bounds(copy_gbps=20000.0, dram_gbps=9000.0), "DRAM peak"),
    (_row(suite="attention", flops=10**12, median_ms=1.0, dtype="float16"),
     Bounds(copy_gbps=3000.0, tflops={"float16": 900.0}), "peak"),
])
def test_the_sanity_check_refuses_impossible_figures(row, bounds, says):
    results.derive([row], bounds)
    with pytest.raises(ImpossibleFigure, match=says):
        results.check([row], bounds)


def test_the_sanity_check_passes_possible_figures():
    rows = [_row(bytes=10**9, median_ms=0.5),  # 2000 GB/s of a 2000 GB/s copy
            _row(suite="decode", bytes=10**9, median_ms=0.5, bound="read"),
            _row(suite="bounds", bytes=10**12, median_ms=0.001)]  # bounds rows are the bounds
    bounds = Bounds(copy_gbps=1950.0, read_gbps=2000.0, dram_gbps=3350.0)
    results.check(results.derive(rows, bounds), bounds)


def test_tables_labels_and_the_copy_legend():
    rows = [_row(gbps=1234.5678, x_torch=None), _row(impl="three_pass", gbps=7.0, x_torch=0.5)]
    lines = report.format_table(rows, report.SUITE_COLUMNS["softmax"]).splitlines()
    assert lines[0].split()[:3] == ["impl", "level", "array"] and set(lines[1]) == {"-"}
    assert "1235" in lines[2] and "4x1024" in lines[2] and "0.50" in lines[3]
    end = lines[0].index("GB/s") + len("GB/s")  # numbers right-aligned
    assert lines[2][:end].endswith("1235") and lines[3][:end].endswith("7")
    assert "% own" not in lines[0]  # a column empty in every row is left out
    decode = _row(suite="decode", M=None, N=None, B=1, H=32, Hkv=8, Sq=1, Sk=65536, D=128,
                  causal=False, splits=32)
    assert report.shape_label(decode) == "B1 H32/8 Sq1 Sk65536 D128 splits=32"
    assert report.copy_label(2950.4) == "copy 2950 GB/s"  # not rounded to "2 GB/s" ...
    assert report.copy_label(2.3456) == "copy 2.346 GB/s"  # ... nor to nothing


def test_every_section_resolves_and_options_parse():
    for name, spec in cli.SECTIONS + (cli.BOUNDS,):
        assert callable(cli._load(spec)), name
    assert cli.parse_args(["--only", "softmax,decode"]).only == ["softmax", "decode"]
    with pytest.raises(SystemExit):
        cli.parse_args(["--only", "softmax,nonsense"])
    with pytest.raises(SystemExit):
        cli.parse_args(["--reps", "0"])
    quick = cli.make_config(cli.parse_args(["--quick", "--reps", "30"]))
    assert quick.mode == "quick" and quick.min_reps == 30 and quick.max_reps >= 30
    assert cli.make_config(cli.parse_args(["--sim-smoke"])).mode == "smoke"
    assert cli.parse_args(["--crossovers"]).crossovers and "crossovers" in cli.OPT_IN


def test_the_triton_peers_compile():
    """Triton is not installed in CI: at least the module must be valid Python."""
    py_compile.compile(str(Path(bench.__file__).parent / "triton_peers.py"), doraise=True)


@pytest.mark.skipif(SIMULATOR, reason="Triton needs a GPU")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_triton_peers_compute_softmax(dtype):
    """Where a GPU, torch and Triton are: both peers run and give softmax — rows shorter
    than a block, a row of several of seed 001's blocks (its loop), a non-power of two,
    a strided view (the row stride passed), and the tutorial's refusal past its limit."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from numba_softmax.bench import triton_peers

    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    gen = torch.Generator().manual_seed(0)
    for rows, n in ((3, 7), (5, 1000), (2, 3 * triton_peers.SEED001_BLOCK + 17)):
        wide = torch.randn(rows, 2 * n, generator=gen).mul(4).to(getattr(torch, dtype)).cuda()
        for x in (wide[:, :n].contiguous(), wide[:, :n]):  # contiguous, and rows 2n apart
            want = R.softmax(x.float().cpu().numpy().astype(np.float64))
            for name, peer in triton_peers.PEERS.items():
                got = peer(x).float().cpu().numpy()
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 1e-2,
                                           err_msg=f"{name} {rows} x {n}")
                y = torch.empty_like(x)
                assert peer(x, y) is y  # into the caller's output
    with pytest.raises(ValueError, match="do not fit"):
        triton_peers.tutorial(torch.zeros(1, triton_peers.TUTORIAL_MAX_N + 1).cuda())


def test_the_one_timer_on_the_simulator():
    calls = []
    t = timing.seconds(lambda: calls.append(1), sim=True, warmup=2, repeat=3, inner=2)
    assert t > 0 and len(calls) == 1 + 1 + 3 * 2  # first call, one warm-up, 3 × 2 timed


# --- the event loop (GPU-only code), with stand-in events ----------------------------------
class _FakeEvent:
    def __init__(self, clock, timing=True):
        self.clock, self.t = clock, None

    def record(self, stream=0):
        self.t = self.clock["now"]

    def query(self):
        return self.clock["starved"]

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return other.t - self.t


@pytest.mark.parametrize("starved", [False, True])
def test_event_timing_branch(monkeypatch, starved):
    clock = {"now": 0.0, "starved": starved}
    holds = []
    monkeypatch.setattr(cuda, "event", lambda timing=True: _FakeEvent(clock, timing))
    monkeypatch.setattr(cuda, "defer_cleanup", contextlib.nullcontext)
    monkeypatch.setattr(timing.Timer, "_hold", lambda self, us: holds.append(us))
    timer = timing.Timer(stream=0, sim=False, min_reps=20, max_reps=20, warmup=2)
    seen = []

    def enqueue(i):  # each "kernel" takes 2 ms on the fake device clock
        seen.append(i)
        clock["now"] += 2.0

    result = timer.device(enqueue, n_sets=3)
    assert result["median_ms"] == result["min_ms"] == 2.0 and result["reps"] == 20
    assert seen[:3] == [0, 1, 2] and seen[3:23] == [i % 3 for i in range(20)]  # rotated
    if starved:  # three tries, each with a longer sleep, then a note
        assert len(holds) == 3 and holds[1] == 4 * holds[0] and "host-bound" in result["note"]
    else:
        assert len(holds) == 1 and result["note"] == ""


# --- end to end ----------------------------------------------------------------------------
def _read_csv(path):
    lines = Path(path).read_text().splitlines()
    comments = [line for line in lines if line.startswith("#")]
    return comments, list(csv.DictReader(line for line in lines if not line.startswith("#")))


def _check_outputs(out):
    comments, rows = _read_csv(out / "results.csv")
    meta = "\n".join(comments)
    for key in ("# device:", "# driver:", "# versions:", "# date:", "# copy bandwidth:",
                "# read bandwidth:", "# mode: smoke"):
        assert key in meta
    header = next(l for l in (out / "results.csv").read_text().splitlines() if l[0] != "#")
    assert header.split(",") == results.CSV_COLUMNS
    for r in rows:
        assert float(r["median_ms"]) > 0 and int(r["reps"]) >= 1, r
        if r["bytes"] and r["suite"] != "overhead":
            assert float(r["gbps"]) > 0 and float(r["pct_copy"]) > 0, r
        if r["flops"]:
            assert float(r["tflops"]) > 0, r
    assert (out / "results.txt").read_text().startswith("device:")
    return rows


def test_sim_smoke_end_to_end(tmp_path, capsys):
    assert bench.main(["--sim-smoke", "--out", str(tmp_path)]) == 0
    rows = _check_outputs(tmp_path)
    by = {(r["suite"], r["impl"], r["level"]) for r in rows}
    assert {("bounds", "d2d copy", "kernel"), ("bounds", "read (numba sum)", "kernel")} <= by
    for method in ("auto", "three_pass", "fused", "online", "split"):
        assert ("softmax", method, "kernel") in by
    assert ("softmax", "auto", "call") in by
    assert next(r for r in rows if r["impl"] == "three_pass")["model_bytes"] == str(4 * 1 * 64 * 4)
    assert ("attention", "numba_softmax", "kernel") in by and ("decode", "split-KV", "kernel") in by
    calls = {r["impl"] for r in rows if r["suite"] == "overhead"}
    assert {"ns.softmax(x)", "ns.softmax(x, out=y)", "ns.logsumexp(x)", "ns.attention(q, q, q)",
            "ns.merge_attention(o, lse, o, lse)"} <= calls
    assert any(c.startswith("decode:") for c in calls)
    out = capsys.readouterr().out
    assert out.count("device:") == 1  # the header, once
    assert "== softmax ==" in out and "== overhead ==" in out
    assert "topk: skipped" in out or ("topk", "softmax_topk", "kernel") in by
    assert "== targets ==" in out and "times mean nothing" in out


@pytest.mark.skipif(not SIMULATOR, reason="on a GPU it takes minutes and saves a table")
def test_crossovers_measure_fit_and_save_nothing_on_the_simulator(tmp_path, monkeypatch, capsys):
    """--crossovers runs that section alone (never in a plain run): every on-chip method
    timed per shape, an entry fitted per item size and printed; the simulator's times
    mean nothing, so no table is saved."""
    table = tmp_path / "table.json"
    monkeypatch.setenv("NUMBA_SOFTMAX_CROSSOVERS", str(table))
    assert bench.main(["--crossovers", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "== crossovers ==" in out and "== softmax ==" not in out
    assert "crossovers, 2-byte values" in out and "crossovers, 4-byte values" in out
    assert not table.exists()
    rows = _check_outputs(tmp_path / "out")
    timed = {(r["impl"], r["dtype"]) for r in rows if r["suite"] == "crossovers"}
    assert {(m, "float32") for m in ("fused", "onchip", "cluster", "group")} <= timed


def test_quick_crossovers_fit_but_keep_nothing(monkeypatch, capsys):
    """``--crossovers --quick`` measures five row sizes: it prints its fit, saves none
    (the full run saves; the simulator's run saves nothing either, above)."""
    from numba_softmax.bench import crossovers
    from numba_softmax.runtime import launcher
    from numba_softmax.kernels.softmax import methods

    saved = []
    monkeypatch.setattr(methods, "save_crossovers", lambda *a, **k: saved.append(a))
    run = types.SimpleNamespace(cfg=types.SimpleNamespace(quick=True, smoke=False), sim=False,
                                limits=launcher.device_limits(), case=lambda name, fn: None)
    run.results = [types.SimpleNamespace(suite="crossovers", M=528, N=n, dtype="float32",
                                         impl=impl, bytes=8 * 528 * n, median_ms=ms)
                   for n, impl, ms in ((4096, "fused", 1.0), (4096, "onchip", 2.0),
                                       (40960, "fused", 3.0), (40960, "onchip", 1.0))]
    crossovers.run(run)
    out = capsys.readouterr().out
    assert "crossovers, 4-byte values" in out and "not saved" in out
    assert saved == []
    run.cfg.quick = False
    crossovers.run(run)
    assert len(saved) == 1  # the full run keeps its fit


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's message")
def test_quick_on_the_simulator_says_it_runs_the_smoke_form(tmp_path, capsys):
    assert bench.main(["--quick", "--only", "topk", "--out", str(tmp_path)]) in (0, 1)
    first = capsys.readouterr().out.splitlines()[0]
    assert "simulator" in first and "--sim-smoke" in first


def _liar_section(monkeypatch):
    def liar(b):  # a "softmax" 1000× faster than the copy just measured
        b.record(dict(median_ms=1e-9, min_ms=1e-9, reps=3), suite="softmax", impl="liar",
                 level="kernel", array="numba", dtype="float32", M=1, N=1, bytes=8)

    fake = types.ModuleType("numba_softmax.bench.fake_section")
    fake.run = liar
    monkeypatch.setitem(sys.modules, "numba_softmax.bench.fake_section", fake)
    monkeypatch.setattr(cli, "SECTIONS", (("softmax", "fake_section:run"),))


def test_an_impossible_figure_stops_the_run(tmp_path, monkeypatch, capsys):
    _liar_section(monkeypatch)
    monkeypatch.setattr(cli, "STOP_IN_SIMULATOR", True)  # as on a GPU
    assert bench.main(["--sim-smoke", "--out", str(tmp_path)]) == cli.STOPPED
    captured = capsys.readouterr()
    assert "STOP: softmax liar" in captured.err and "impossible" in captured.err
    assert "liar" not in captured.out  # never printed as a result ...
    assert not (tmp_path / "results.csv").exists()  # ... nor written


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's host-clock times")
def test_on_the_simulator_an_impossible_figure_is_a_note(tmp_path, monkeypatch, capsys):
    """Simulator times are Python threads on a host clock (a decode row once came out at
    229 % of the read stream by chance): a note, not a stop."""
    _liar_section(monkeypatch)
    assert bench.main(["--sim-smoke", "--out", str(tmp_path)]) == 0
    assert "note (simulator, not a stop): softmax liar" in capsys.readouterr().err


def _fake_attention(q, k, v, *, causal=False, scale=None, return_lse=False, num_splits=1,
                    out=None, stream=None):
    """The NumPy reference behind the public signature (Numba arrays in and out)."""
    host = [a.copy_to_host() if hasattr(a, "copy_to_host") else a for a in (q, k, v)]
    o = R.attention(*host, causal=causal, scale=scale).astype(host[0].dtype)
    if out is None:
        return o if isinstance(q, np.ndarray) else cuda.to_device(o)
    out.copy_to_device(np.ascontiguousarray(o))
    return out


@pytest.mark.skipif(not SIMULATOR, reason="the stand-in takes Numba arrays (no torch there)")
def test_attention_sections_with_a_stand_in_module(tmp_path, monkeypatch):
    """The attention and decode code paths of the harness, independent of the kernels
    (the stand-in has GQA, so decode takes the grouped-heads path)."""
    fake = types.ModuleType("numba_softmax.attention")
    fake.attention = _fake_attention
    monkeypatch.setitem(sys.modules, "numba_softmax.attention", fake)
    assert bench.main(["--sim-smoke", "--only", "attention,decode", "--out", str(tmp_path)]) == 0
    rows = _check_outputs(tmp_path)
    attn = [r for r in rows if r["suite"] == "attention"]
    assert {r["level"] for r in attn} == {"kernel", "call"}
    assert all(int(r["flops"]) == results.attention_flops(1, 1, 16, 16, 16, True) for r in attn)
    decode = [r for r in rows if r["suite"] == "decode"]
    # the dense row (through the stand-in) and, now that it exists, the paged one
    assert {(r["H"], r["Hkv"], r["Sk"], r["note"]) for r in decode} == {("2", "1", "64", "")}
    assert int(decode[0]["bytes"]) == 2 * 1 * 1 * 64 * 16 * 4 and decode[0]["bound"] == "read"
    assert not [r for r in rows if r["suite"] in ("softmax", "overhead")]  # --only


def test_a_missing_feature_is_a_one_line_skip(monkeypatch):
    from numba_softmax.bench.context import Skip, feature

    assert feature("numba_softmax:softmax") is importlib.import_module("numba_softmax").softmax
    with pytest.raises(Skip, match="numba_softmax.no_such_thing not available"):
        feature("numba_softmax:no_such_thing")
    assert importlib.util.find_spec("numba_softmax.bench.__main__") is not None
