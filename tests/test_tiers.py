"""The two tiers of the suite (tests/conftest.py): every test and case the quick tier's lists
name exists, so a renamed test or case cannot silently move back into the quick tier, and
the quick tier keeps at least one case of every parametrised test."""

import os
import subprocess
import sys

import conftest
import pytest

from _helpers import ROOT, SIMULATOR


def collected():
    """Node ids of the full tier, as ``file::test`` → set of parameter ids ('' for none)."""
    # collected as CI collects them, on the simulator: some parameter ids follow the device
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-qq", "--full",
                          "-p", "no:cacheprovider", "-n", "0", "tests"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, f"collection failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    out = run.stdout
    tests = {}
    for line in out.splitlines():
        if "::" in line:
            test, _, params = line.strip().partition("[")
            tests.setdefault(test.split("/")[-1], set()).add(params[:-1])
    return tests


@pytest.mark.skipif(not SIMULATOR, reason="the lists name the simulator's cases: CI checks them")
def test_the_quick_tier_lists_name_collected_tests():
    tests = collected()
    files = {t.split("::")[0] for t in tests}

    def gone(test):  # a file that collected nothing was skipped (a missing optional
        # dependency, e.g. the docs' Sphinx extensions): only a vanished one is stale
        file = test.split("::")[0]
        return file in files or not (ROOT / "tests" / file).exists()

    stale = [t for t in conftest.FULL_ONLY if t not in tests and gone(t)]
    for table in (conftest.QUICK_CASES, conftest.QUICK_WITHOUT):
        stale += [f"{t}[{p}]" for t, cases in table.items() for p in cases
                  if p not in tests.get(t, ()) and gone(t)]
    assert not stale, f"tests/conftest.py names tests that no longer exist: {stale}"
    for test, cases in tests.items():  # a parametrised test keeps a case, unless all are out
        if test not in conftest.FULL_ONLY:
            assert any(not conftest._left_to_full(f"tests/{test}[{p}]" if p else f"tests/{test}")
                       for p in cases), test


def test_on_a_gpu_the_quick_tier_keeps_every_case_of_the_listed_tests(monkeypatch):
    """QUICK_CASES and QUICK_WITHOUT name the simulator's case ids; a GPU's cases of those
    tests have other sizes and ids, and once went missing from its quick tier (and from the
    GPU check's suite) altogether.  On a GPU only FULL_ONLY is left out."""
    monkeypatch.setattr(conftest, "SIMULATOR", False)
    for test in list(conftest.QUICK_CASES)[:3] + list(conftest.QUICK_WITHOUT)[:3]:
        assert not conftest._left_to_full(f"tests/{test}[a-gpu-sized-case]"), test
    assert conftest._left_to_full(f"tests/{conftest.FULL_ONLY[0]}")
    monkeypatch.setattr(conftest, "SIMULATOR", True)
    test, cases = next(iter(conftest.QUICK_CASES.items()))
    assert conftest._left_to_full(f"tests/{test}[a-gpu-sized-case]")
    assert not conftest._left_to_full(f"tests/{test}[{cases[0]}]")
