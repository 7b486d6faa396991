"""The ``numba-softmax`` command: the tour runs end to end and its numbers agree."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import numba_softmax
from numba_softmax import cli
from _helpers import SIMULATOR

ROOT = Path(__file__).resolve().parent.parent


def test_tour_runs_and_the_online_state_matches_the_naive_one(capsys):
    assert cli.main(["tour", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "running on" in out
    final = re.search(r"final   \(m, ℓ\) = \(([-\d.]+), ([-\d.]+)\)", out)
    naive = re.search(r"naive   max = ([-\d.]+), Σ exp\(x − max\) = ([-\d.]+)", out)
    assert final and naive and final.groups() == naive.groups()
    for method in ["three_pass", "fused", "online", "split", "auto"]:
        row = re.search(rf"^\s+{method}\s+([\d.e+-]+)\s+([\d.e+-]+)", out, re.M)
        assert row, method
        assert float(row.group(1)) < 1e-5 and float(row.group(2)) < 1e-5
    if SIMULATOR:  # times there would measure Python threads: said, and none shown
        assert "times mean nothing" in out
        assert re.search(r"^\s+fused\s+\S+\s+\S+\s+—$", out, re.M)


def test_unknown_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main(["tour", "--bogus"])
    assert "unrecognized arguments" in capsys.readouterr().err


def test_version_and_plain_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"numba-softmax {numba_softmax.__version__}"
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert "tour" in text and "bench" in text
    assert "``" not in text and ":mod:" not in text and ":func:" not in text  # no RST


def _python(code, env=None):
    env = env or dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_closed_pipe_ends_quietly():
    """``numba-softmax tour | head``: the reader leaves; no BrokenPipeError."""
    proc = _python("import sys\nfrom numba_softmax import cli\n"
                   "cli.main = lambda argv=None: print('row\\n' * 100000) or 0\n"
                   "sys.exit(cli.run())")
    proc.stdout.close()  # before the child writes: its first flush meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and "BrokenPipe" not in err, err


def test_an_example_without_sim_falls_back_when_there_is_no_gpu():
    probe = _python("from numba import cuda; print(cuda.is_available())",
                    env=_without_sim())
    if probe.communicate(timeout=120)[0].decode().strip() != "False":
        pytest.skip("a GPU is usable here: the example would run on it")
    # --help: the switch happens when _common is imported, before any option is read
    # (the rest of a --sim run is what test_examples.py runs)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "04_chunk_merge.py"),
                           "--help"], cwd=ROOT, env=_without_sim(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()[:2]
    assert first.startswith("No usable CUDA GPU here: running on the CUDA simulator"), first
    assert second.startswith("usage: 04_chunk_merge.py")
    assert "Traceback" not in proc.stderr and "CudaSupportError" not in proc.stderr


def _without_sim():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env
