"""scripts/gpu_check.py's record logic (no GPU needed): a check made in parts merges only
records of the same package source, and the verdict covers every part."""

from pathlib import Path

import pytest

from _helpers import ROOT, load_script


def load():
    return load_script("scripts/gpu_check.py")


ENV = dict(source_hash="abc", device="GPU", date="now", git_hash="new", driver="1", numba="1",
           numba_cuda="1", numpy="1", cupy="1", torch="1", python="3")
EARLIER = dict(source_hash="abc", device="GPU", git_hash="old", date="then", jobs=[
    dict(name="suite", exit=1, failed=1, seconds=1.0),
    dict(name="fuzz-0", exit=0, hypothesis_examples=900, seconds=1.0),
    dict(name="timed-02", exit=0, examples_run=1, seconds=1.0)])


def test_merge_keeps_the_jobs_this_run_did_not_run_and_judges_them_all():
    g = load()
    env = dict(ENV)
    now = [dict(name="suite", exit=0, passed=5, seconds=1.0),
           dict(name="fuzz-6", exit=0, hypothesis_examples=900, seconds=1.0)]
    jobs = g.merged(env, now, EARLIER)
    assert [j["name"] for j in jobs] == ["suite", "fuzz-6", "fuzz-0", "timed-02"]
    lines, ok, fuzz = g.summary(env, jobs)
    assert ok and fuzz == 1800 and lines[-1] == "GPU CHECK: PASS"  # the new suite replaced the failed one
    assert any("merged: fuzz-0, timed-02 from the run of then on tree old" in x for x in lines)
    failing = [dict(name="fuzz-6", exit=1, failed=1, seconds=1.0)]
    lines, ok, _ = g.summary(dict(ENV), g.merged(dict(ENV), failing, EARLIER))
    assert not ok and "suite" in lines[-1] and "fuzz-6" in lines[-1]  # old failures count too


def test_merge_refuses_another_package_source():
    g = load()
    with pytest.raises(SystemExit, match="another package source"):
        g.merged(dict(ENV, source_hash="zzz"), [], EARLIER)


def test_code_ignores_docstrings_and_comments_only():
    cr = load_script("scripts/check_record.py")
    a = 'def f(x):\n    """Doubles."""\n    return 2 * x  # twice\n'
    b = 'def f(x):\n    """Twice x (a better word)."""\n    return 2 * x\n'
    c = 'def f(x):\n    """Doubles."""\n    return 3 * x\n'
    assert cr._code(a) == cr._code(b) and cr._code(a) != cr._code(c)
    assert cr._code('"""Module."""\nX = 1\n') == cr._code("X = 1  # one\n")


def test_simulator_only_modules_are_found_from_their_imports():
    cr = load_script("scripts/check_record.py")
    gated = b"from .._sim import simulator_enabled\nif simulator_enabled():\n    from ._emu import f\nelse:\n    from ._real import f\n"
    assert cr.simulator_only("pkg/_emu.py", {"pkg/a.py": gated})
    assert not cr.simulator_only("pkg/_real.py", {"pkg/a.py": gated})  # the else branch: the GPU's
    both = {"pkg/a.py": gated, "pkg/b.py": b"from ._emu import g\n"}  # imported unconditionally too
    assert not cr.simulator_only("pkg/_emu.py", both)
    assert not cr.simulator_only("pkg/_nowhere.py", {"pkg/a.py": gated})  # never imported: unknown
    real = {str(p.relative_to(ROOT)): p.read_bytes() for p in (ROOT / "numba_softmax").rglob("*.py")}
    assert cr.simulator_only("numba_softmax/kernels/hw/_mma_sim.py", real)
    assert not cr.simulator_only("numba_softmax/runtime/sim.py", real)  # simulator_enabled() is used everywhere


def test_suite_workers_and_fuzz_shards_in_the_jobs():
    from types import SimpleNamespace

    gc = load()
    args = SimpleNamespace(suite_workers=12, suite_examples=40, limit=100, fuzz_first_seed=6,
                           fuzz_shards=2, fuzz_examples=100, skip_sanitizers=True)
    by_name = {name: cmd for name, cmd, _, _ in gc.jobs(args, Path("/tmp"))}
    suite = by_name["suite"]
    last_n = len(suite) - 1 - suite[::-1].index("-n")  # (PYTEST's own -n 0 comes first)
    assert suite[last_n + 1] == "12"
    assert "--full" in suite  # the full tier: the quick one leaves tests to it
    assert {"fuzz-6", "fuzz-7", "reliability", "examples"} <= set(by_name)
    assert not any(n.startswith("sanitize") for n in by_name)
    assert "--hypothesis-seed=1006" in by_name["fuzz-6"]
    assert not any(n.startswith("suite-as") for n in by_name)
    args.emulate = "a100,ada"  # --as: the suite again with each one's launch limits
    jobs = {name: (cmd, env) for name, cmd, _, env in gc.jobs(args, Path("/tmp"))}
    assert jobs["suite-as-ada"][0] == suite and jobs["suite-as-ada"][1]["NUMBA_SOFTMAX_TEST_AS"] == "ada"
    assert jobs["suite-as-a100"][1]["NUMBA_SOFTMAX_TEST_AS"] == "a100"


def test_default_run_draws_ten_thousand_fuzz_cases_with_every_job_at_once():
    gc = load()
    args = gc.parser().parse_args([])
    assert args.fuzz_shards * args.fuzz_examples * gc.FUZZ_TESTS_ON_GPU >= 10_000
    assert args.workers is None  # no job waits for a worker (a queued one adds its whole time)
    args = gc.parser().parse_args(["--fuzz-shards", "3", "--fuzz-examples", "7", "--workers", "2"])
    assert (args.fuzz_shards, args.fuzz_examples, args.workers) == (3, 7, 2)
