"""The benchmark harness: its pure helpers, and one --sim-smoke run end to end."""

import csv
import importlib.util
import sys
import types

import numpy as np
import pytest
from numba import cuda

from numba_softmax import bench
from numba_softmax import reference as R


# --- pure helpers ------------------------------------------------------------------------
def test_softmax_bytes_is_one_read_and_one_write():
    assert bench.softmax_bytes(16384, 1024, 4) == 2 * 16384 * 1024 * 4 == 128 * 2**20
    assert bench.softmax_bytes(1, 16777216, 2) == 64 * 2**20


def test_attention_flops_and_bytes():
    assert bench.attention_flops(2, 3, 5, 7, 11) == 4 * 2 * 3 * 5 * 7 * 11
    assert bench.attention_flops(2, 3, 5, 7, 11, causal=True) == 2 * 2 * 3 * 5 * 7 * 11
    # q, o: Sq rows; k, v: Sk rows; all B·H heads of D values
    assert bench.attention_bytes(1, 2, 1, 100, 8, 2) == 2 * (2 * 1 + 2 * 100) * 8 * 2


def test_median():
    assert bench.median([3.0, 1.0, 2.0]) == 2.0
    assert bench.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert bench.median([7]) == 7
    with pytest.raises(ValueError):
        bench.median([])


def test_gbps():
    assert bench.gbps(2e9, 1000.0) == pytest.approx(2.0)


def test_buffer_sets():
    mib = 2**20
    assert bench.buffer_sets(256 * mib, 50 * mib, 80 * 2**30) == 2  # large: two suffice
    assert bench.buffer_sets(10 * mib, 50 * mib, 80 * 2**30) == 15  # span 3 × L2
    assert bench.buffer_sets(1024, 50 * mib, 80 * 2**30) == 64  # capped
    assert bench.buffer_sets(4 * 2**30, 50 * mib, 6 * 2**30) == 1  # memory-bound
    assert bench.buffer_sets(100, 0, 1 << 34) == 2  # simulator: no L2


def test_choose_reps():
    assert bench.choose_reps(1e-5, 20, 100, 0.3, 5.0) == (100, "")  # fast: capped above
    assert bench.choose_reps(0.01, 20, 100, 0.3, 5.0) == (30, "")  # about target_s of work
    assert bench.choose_reps(0.1, 20, 100, 0.3, 5.0) == (20, "")  # never below min_reps ...
    reps, note = bench.choose_reps(1.0, 20, 100, 0.3, 5.0)  # ... unless the case is too slow
    assert reps == 5 and "slow" in note
    assert bench.choose_reps(10.0, 20, 100, 0.3, 5.0)[0] == 5  # a floor of 5


def test_decode_splits():
    assert bench.decode_splits(16, 132, 16384) == 32  # >= 2 blocks per SM, a power of 2
    assert bench.decode_splits(1, 4, 64) == 2  # no split under 64 keys, but at least 2


def _row(**kw):
    base = dict(suite="softmax", impl="fused", level="kernel", array="numba", dtype="float32",
                median_ms=1.0, min_ms=0.9, reps=20, M=4, N=1024)
    base.update(kw)
    return bench.Result(**base)


def test_derive_fills_rates_and_ratio_to_torch():
    ours = _row(bytes=4 * 10**9)
    torch_row = _row(impl="torch", median_ms=2.0, bytes=4 * 10**9)
    other_shape = _row(N=2048, bytes=10**9)
    attn = _row(suite="attention", impl="numba_softmax", M=None, N=None, B=1, H=1, Sq=8,
                Sk=8, D=8, causal=True, flops=2 * 10**12, median_ms=1000.0)
    bench.derive([ours, torch_row, other_shape, attn], copy_gbps=8000.0)
    assert ours.gbps == pytest.approx(4000.0)
    assert ours.pct_copy == pytest.approx(50.0)
    assert ours.x_torch == pytest.approx(2.0)  # torch takes twice as long
    assert torch_row.x_torch == pytest.approx(1.0)
    assert other_shape.x_torch is None  # no torch row of that shape
    assert attn.tflops == pytest.approx(2.0)


def test_format_table_aligns_and_blanks_missing_values():
    rows = [_row(gbps=1234.5678, x_torch=None), _row(impl="three_pass", gbps=7.0, x_torch=0.5)]
    text = bench.format_table(rows)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["impl", "level", "array"]
    assert set(lines[1]) == {"-"}
    assert len(lines) == 4
    assert "1235" in lines[2] and "4x1024" in lines[2]
    assert "0.50" in lines[3]
    # numbers are right-aligned: the GB/s column ends at the same offset in both rows
    header = lines[0]
    end = header.index("GB/s") + len("GB/s")
    assert lines[2][:end].endswith("1235") and lines[3][:end].endswith("7")


def test_shape_labels():
    assert bench.shape_label(_row(M=16384, N=1024)) == "16384x1024"
    attn = _row(suite="decode", B=1, H=16, Sq=1, Sk=65536, D=128, causal=False, splits=32)
    assert bench.shape_label(attn) == "B1 H16 Sq1 Sk65536 D128 splits=32"


# --- end to end ------------------------------------------------------------------------------
def _read_csv(path):
    with open(path) as f:
        lines = f.read().splitlines()
    comments = [line for line in lines if line.startswith("#")]
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    return comments, rows


def _check_outputs(out):
    comments, rows = _read_csv(out / "results.csv")
    meta = "\n".join(comments)
    for key in ("# device:", "# driver:", "# versions:", "# date:", "# copy bandwidth:"):
        assert key in meta
    assert "numba-cuda" in meta
    with open(out / "results.csv") as f:
        header = next(line for line in f if not line.startswith("#")).strip().split(",")
    assert header == bench.CSV_COLUMNS
    for r in rows:
        assert float(r["median_ms"]) > 0 and float(r["min_ms"]) > 0, r
        assert int(r["reps"]) >= 3
        if r["bytes"]:
            assert float(r["gbps"]) > 0 and float(r["pct_copy"]) > 0, r
        if r["flops"]:
            assert float(r["tflops"]) > 0, r
    assert (out / "results.txt").read_text().startswith("device:")
    if importlib.util.find_spec("matplotlib") is not None:  # the plot is of softmax rows
        has_softmax = any(r["suite"] == "softmax" for r in rows)
        assert (out / "softmax_gbps.png").exists() == has_softmax
    return rows


def test_sim_smoke_end_to_end(tmp_path, capsys):
    assert bench.main(["--sim-smoke", "--out", str(tmp_path)]) == 0
    rows = _check_outputs(tmp_path)
    by = {(r["suite"], r["impl"], r["level"]) for r in rows}
    assert ("copy", "d2d copy", "kernel") in by
    for method in bench.KERNEL_METHODS:
        assert ("softmax", method, "kernel") in by
    for method in bench.CALL_METHODS:
        assert ("softmax", method, "call") in by
    assert ("overhead", "ns.softmax", "call") in by
    softmax_rows = [r for r in rows if r["suite"] == "softmax"]
    assert all(r["M"] == "2" and r["N"] == "64" and r["dtype"] == "float32" for r in softmax_rows)
    assert all(int(r["bytes"]) == bench.softmax_bytes(2, 64, 4) for r in softmax_rows)
    printed = capsys.readouterr().out
    assert "== softmax ==" in printed and "device:" in printed
    if bench._load_attention()[0] is not None:  # the real attention module, once it imports
        assert ("attention", "numba_softmax", "kernel") in by
        assert {r["splits"] for r in rows if r["suite"] == "decode"} == {"1", "2"}


def _fake_attention(q, k, v, *, causal=False, scale=None, return_lse=False, num_splits=1,
                    out=None, stream=None):
    """The NumPy reference behind the public signature (any CUDA array in, Numba out)."""
    q, k, v = (a if hasattr(a, "copy_to_host") else cuda.as_cuda_array(a) for a in (q, k, v))
    o = R.attention(q.copy_to_host(), k.copy_to_host(), v.copy_to_host(), causal=causal,
                    scale=scale).astype(q.dtype)
    if out is None:
        return cuda.to_device(o)
    target = out if hasattr(out, "copy_to_device") else cuda.as_cuda_array(out)
    target.copy_to_device(np.ascontiguousarray(o))
    return out


def test_attention_rows_with_a_stand_in_module(tmp_path, monkeypatch):
    """The attention and decode code path of the harness, independent of the kernels."""
    fake = types.ModuleType("numba_softmax.attention")
    fake.attention = _fake_attention
    monkeypatch.setitem(sys.modules, "numba_softmax.attention", fake)
    assert bench.main(["--sim-smoke", "--only", "attention", "--out", str(tmp_path)]) == 0
    rows = _check_outputs(tmp_path)
    attn = [r for r in rows if r["suite"] == "attention" and r["impl"] == "numba_softmax"]
    assert {r["level"] for r in attn} == {"kernel", "call"}
    assert all(r["causal"] == "True" and r["Sq"] == r["Sk"] == "16" for r in attn)
    flops = bench.attention_flops(1, 1, 16, 16, 16, causal=True)
    assert all(int(r["flops"]) == flops for r in attn)
    decode = [r for r in rows if r["suite"] == "decode" and r["impl"] == "numba_softmax"]
    assert {r["splits"] for r in decode} == {"1", "2"}
    assert all(r["Sq"] == "1" and r["Sk"] == "64" for r in decode)
    assert not [r for r in rows if r["suite"] == "softmax"]  # --only attention


# --- the event loop (GPU-only code), with stand-in events --------------------------------
class _FakeEvent:
    """Records a fake device clock; ``query`` says whether the sleep already ended."""

    def __init__(self, clock, timing=True):
        self.clock, self.t = clock, None

    def record(self, stream=0):
        self.t = self.clock["now"]

    def query(self):
        return self.clock["starved"]

    def elapsed_time(self, other):
        return other.t - self.t


class _FakeCuda:
    def __init__(self, clock):
        self.clock = clock

    def event(self, timing=True):
        return _FakeEvent(self.clock, timing)

    def defer_cleanup(self):
        import contextlib

        return contextlib.nullcontext()

    def synchronize(self):
        pass


class _FakeStream:
    def synchronize(self):
        pass


@pytest.mark.parametrize("starved", [False, True])
def test_event_timing_branch(monkeypatch, starved):
    clock = {"now": 0.0, "starved": starved}
    holds = []
    monkeypatch.setattr(bench, "cuda", _FakeCuda(clock))
    monkeypatch.setattr(bench.Timer, "_hold", lambda self, us: holds.append(us))
    cfg = bench.Config((), (), (), (), (), (), min_reps=20, max_reps=20, warmup=2)
    timer = bench.Timer(cfg, _FakeStream(), sim=False)
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


def test_configs_and_plan(monkeypatch):
    full = bench.make_config(bench.parse_args([]))
    assert full.softmax_shapes == bench.SOFTMAX_SHAPES and full.softmax_dtypes == ("float32",)
    assert full.min_reps == 20 and full.attn_dtypes == ("float32", "float16")
    quick = bench.make_config(bench.parse_args(["--quick", "--fp16", "--reps", "30"]))
    assert set(quick.softmax_shapes) < set(bench.SOFTMAX_SHAPES)
    assert quick.softmax_dtypes == ("float32", "float16") and quick.min_reps == 30
    with pytest.raises(SystemExit):
        bench.parse_args(["--reps", "0"])

    fake = types.ModuleType("numba_softmax.attention")
    fake.attention = _fake_attention
    monkeypatch.setitem(sys.modules, "numba_softmax.attention", fake)
    labels = [label for label, _ in bench.plan(bench.Bench(full, sim=True), None)]
    assert labels[0] == "copy bandwidth" and "softmax 1x16777216 float32" in labels
    assert sum(x.startswith("softmax") for x in labels) == 8
    assert sum(x.startswith("attention") for x in labels) == 2 * 2 * 3 * 2  # dtype, D, S, causal
    assert sum(x.startswith("decode") for x in labels) == 2 * 3
    only = [label for label, _ in bench.plan(bench.Bench(full, sim=True), "attention")]
    assert not any(x.startswith(("softmax", "overhead")) for x in only)
