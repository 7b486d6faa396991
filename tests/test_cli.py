"""The ``numba-softmax`` command: the tour runs end to end and its numbers agree."""

import re

from numba_softmax import cli


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


def test_unknown_arguments_are_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        cli.main(["tour", "--bogus"])
    assert "unrecognized arguments" in capsys.readouterr().err
