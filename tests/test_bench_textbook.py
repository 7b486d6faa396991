"""The bench's ``textbook`` section: each rung of ``numba_softmax/textbook/`` beside its fast
kernel, in the smoke form (tiny shapes: the CUDA simulator runs it in seconds).

The section runs by itself and by default, gives one ``textbook`` row and one ``fast`` row
per rung, the fast row carrying the rung's time (``base_ms``) and the ratio; a rung whose
output differs from its fast kernel's fails and is not timed.
"""

import csv

import numpy as np
import pytest
from numba import cuda

from numba_softmax import bench
from numba_softmax.bench import cli, report
from numba_softmax.bench import textbook as tb
from numba_softmax.bench.context import Bench
from numba_softmax.bench.results import Result
from numba_softmax.textbook import RUNGS

FAST = {"s1": "three_pass", "s2": "three_pass", "s3": "online", "s4": "fused", "s5": "split",
        "a1": "attention float32", "a2": "attention float16", "d1": "decode",
        "b1": "softmax_backward", "b2": "attention_backward"}


def _rows(path):
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    return [r for r in csv.DictReader(lines) if r["suite"] == "textbook"]


def test_the_section_is_registered_and_runs_by_default():
    names = [name for name, _ in cli.SECTIONS]
    assert "textbook" in names and "textbook" not in cli.OPT_IN
    assert cli.parse_args(["--only", "textbook"]).only == ["textbook"]
    assert "\ntextbook " in bench.__doc__  # the docstring's section list
    assert sorted(FAST) == sorted(name.split("_")[0] for name in RUNGS)  # every rung is paired


def test_every_rung_beside_its_fast_kernel(tmp_path, capsys):
    assert bench.main(["--sim-smoke", "--only", "textbook", "--out", str(tmp_path)]) == 0
    rows = _rows(tmp_path / "results.csv")
    assert [r["impl"] for r in rows] == [x for tag in FAST
                                         for x in (f"textbook {tag}", f"fast {FAST[tag]}")]
    for rung, fast in zip(rows[::2], rows[1::2]):
        shape = ("dtype", "M", "N", "B", "H", "Sq", "Sk", "D", "splits", "bytes", "flops")
        assert [rung[k] for k in shape] == [fast[k] for k in shape], rung["impl"]  # same problem
        assert rung["base"] == "" and fast["base"] == rung["impl"]
        assert float(fast["base_ms"]) == float(rung["median_ms"])
        assert float(fast["x_base"]) == pytest.approx(float(fast["median_ms"]) / float(rung["median_ms"]))
        assert float(rung["gbps"]) > 0 and rung["model_bytes"], rung["impl"]
    by = {r["impl"]: r for r in rows}
    m, n = tb.SOFTMAX["smoke"][0]
    assert by["textbook s2"]["model_bytes"] == str(4 * m * n * 4)  # its three reads, one write
    assert by["textbook s4"]["model_bytes"] == str(2 * m * n * 4)
    assert by["textbook s2"]["bytes"] == str(2 * m * n * 4)  # compulsory: x read, y written
    assert by["textbook a2"]["dtype"] == "float16" and by["textbook a1"]["flops"]
    assert by["textbook d1"]["bound"] == "read" and by["textbook d1"]["Sq"] == "1"
    out = capsys.readouterr().out
    assert "== textbook ==" in out and "× textbook" in out and "FAILED" not in out


def test_a_wrong_rung_fails_and_is_not_timed(monkeypatch):
    from numba_softmax.textbook import s3_online

    right = s3_online.launch

    def off_by_a_little(x, y=None, threads=32):
        y = right(x, y, threads=threads)
        host = y.copy_to_host()
        host[-1, -1] += np.float32(1e-3)
        y.copy_to_device(host)
        return y

    monkeypatch.setattr(s3_online, "launch", off_by_a_little)
    b = Bench(cli.make_config(cli.parse_args(["--sim-smoke"])), sim=True)
    timer = tb.Timer(0, True, min_reps=1, max_reps=1, warmup=0)
    tb.softmax_pair(b, timer, "s3", "online", 2, 100)
    assert b.failed == 1 and "FAILED textbook s3 float32 2x100" in b.skipped[0]
    assert "max |rung − fast online| = 0.001" in b.skipped[0]
    assert [r.impl for r in b.results] == ["fast online"] and b.results[0].base is None


def test_mismatch_is_exact_and_nan_fails():
    want = cuda.to_device(np.array([0.0, 1.0], np.float32))
    assert tb.mismatch(cuda.to_device(np.array([0.0, 1.0], np.float32)), want, (0, 0)) is None
    assert tb.mismatch(cuda.to_device(np.array([0.0, 1.5], np.float32)), want, (0.1, 0.1)) == 0.5
    assert tb.mismatch(cuda.to_device(np.array([0.0, 1.5], np.float32)), want, (0.25, 0.25)) is None
    assert np.isnan(tb.mismatch(cuda.to_device(np.array([np.nan, 1.0], np.float32)), want, (1, 1)))


def test_the_table_shows_the_speed_up_of_the_fast_row():
    kw = dict(suite="textbook", level="kernel", array="numba", dtype="float32", min_ms=1.0,
              reps=20, M=4, N=1024)
    rows = [Result(impl="textbook s3", median_ms=3.0, **kw),
            Result(impl="fast online", median_ms=0.5, base="textbook s3", base_ms=3.0, **kw)]
    lines = report.format_table(rows, report.SUITE_COLUMNS["textbook"]).splitlines()
    assert "× textbook" in lines[0]
    assert lines[2].rstrip().endswith("3") and lines[3].rstrip().endswith("6.00")
