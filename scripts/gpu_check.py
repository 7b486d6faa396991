#!/usr/bin/env python
"""The one way this project is checked on a GPU, and the record it leaves.

    python scripts/gpu_check.py --out DIR [--git-hash HASH]        # everything, in one command
    python scripts/gpu_check.py --only suite,fuzz --fuzz-shards 2    # a part
    python scripts/gpu_check.py --skip-timed --fuzz-first-seed 8 \
        --merge docs/benchmarks/gpu-check-<device>.json              # the check in two parts
    python scripts/gpu_check.py --only suite-as --as a100,ada        # the suite as older GPUs

On a device lent 10 minutes a command, in two parts, the second merging the first.  On
an H200 the first part took 336–352 s, on an H100 190–230 s — with the suite's quick
tier; the suite job runs the full tier since tree 617877d (398 s on an H100 at tree
ca4e546, beside the reliability and example jobs: give part A 510 s).  The second runs its twelve
jobs at once — 8 fuzz shards of about 1400 cases (11,369 in the H100 record) and the four
sanitizers; run beside one another, shards and sanitizers have taken 205–330 s each
(the H100: 276 s for the whole command), where ten shards and four sanitizers
through twelve workers took 586 s (the two queued jobs waited for the first to end; hence
``--workers``' default, every job at once)::

    python scripts/gpu_check.py --out A --git-hash H --only suite,reliability,examples \
        --skip-timed --suite-workers 13 --limit 510
    python scripts/gpu_check.py --out B --git-hash H --only fuzz,sanitize --fuzz-shards 8 \
        --skip-timed --limit 480 --merge A/gpu-check-<device>.json

and, when there is time for it, the suite with older GPUs' launch limits (≈ 430 s)::

    python scripts/gpu_check.py --out C --git-hash H --only suite-as --as a100,ada \
        --suite-workers 8 --limit 520 --merge B/gpu-check-<device>.json

Phase 1 — correctness, in parallel processes (they may share the GPU: nothing is timed):
the test suite under the ``gpu`` Hypothesis profile (everything but the jobs below),
the reliability tests, the fuzz run split into shards (one Hypothesis seed each, so every
shard draws new cases; the total number of generated cases is counted from Hypothesis'
statistics), every example that does not time anything in its GPU form, and
compute-sanitizer's memcheck, racecheck, synccheck and initcheck over
``scripts/sanitize.py``'s ragged workload.  With ``--as a100,ada``, the suite again for
each, with that GPU's launch limits (``NUMBA_SOFTMAX_TEST_AS``, ``tests/conftest.py``:
its shared memory a block and compute capability, so the kernels take its tiles and
instructions — on this GPU's hardware; ``docs/caveats.md``).

Phase 2 — what times kernels runs alone, after phase 1, one job at a time: the examples
that print timings (their numbers would be polluted by anything sharing the GPU), and
example 10 under ``torchrun --nproc_per_node=1`` (the torch.distributed ring over NCCL,
one rank: its code path for any P) when torchrun is installed.

Every job has a time limit; a job that fails, times out or reports a sanitizer error is a
failing check.  The record — ``gpu-check-<device>.json`` and a short ``.txt`` — holds
the device, driver, CUDA and package versions, the date, the git hash of the tree it ran
on, a hash of the package's source files (``scripts/check_record.py`` says whether a
committed record is current) and, per job: passed / failed / skipped counts, examples
run, sanitizer errors, wall time.  The last line is ``GPU CHECK: PASS`` or
``GPU CHECK: FAIL (…)``.
"""

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PYTEST = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-ra", "-n", "0"]
OWN_JOBS = ("tests/test_fuzz.py", "tests/test_reliability.py", "tests/test_examples.py",
            "tests/test_docs.py", "tests/test_bench.py")
TIMED_EXAMPLES = ("02_block_sweep.py", "03_memory_traffic.py", "05_flash_attention.py",
                  "06_split_kv_decode.py", "12_which_kernel.py", "13_serve.py")
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")


def source_hash(root=ROOT):
    """SHA-256 over the package's source files (path and bytes, sorted)."""
    h = hashlib.sha256()
    for p in sorted((root / "numba_softmax").rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def environment(git_hash):
    def version(mod):
        try:
            return __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent or broken: say so
            return None

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout
    except FileNotFoundError:  # no driver tools: not a GPU machine
        smi = "no GPU,"
    name, _, driver = (smi.strip().splitlines() or [","])[0].partition(",")
    from numba import cuda

    try:
        rt = ".".join(map(str, cuda.runtime.get_version()))
    except Exception:  # noqa: BLE001 - the simulator has no runtime
        rt = None
    return {"device": name.strip(), "driver": driver.strip(), "cuda_runtime": rt,
            "numba": version("numba"), "numba_cuda": version("numba_cuda"),
            "numpy": version("numpy"), "cupy": version("cupy"), "torch": version("torch"),
            "python": sys.version.split()[0],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_hash": git_hash, "source_hash": source_hash()}


def run(name, cmd, log_dir, limit, env=None):
    """Run one job; returns its result dict (exit code, wall time, log path)."""
    log = log_dir / f"{name}.log"
    t0 = time.time()
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "w") as f:  # a session of its own: a timeout ends its children too
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = 124
    text = log.read_text(errors="replace")
    return {"name": name, "exit": code, "seconds": round(time.time() - t0, 1),
            **parse(text), "log": log.name}


_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")
_EXAMPLES = re.compile(r"(\d+) passing(?: examples?)?, (\d+) failing(?: examples?)?")
_SANITIZER = re.compile(r"^SANITIZER \w+: (\d+|\?) errors", re.M)  # scripts/sanitize.py's verdict
_FAILED = re.compile(r"(?:FAILED|ERROR) (tests/\S+::[^\s]+)")
_EXAMPLE_RUN = re.compile(r"^== example (\S+) exit (\d+)$", re.M)


def parse(text):
    out = {}
    tail = [line for line in text.splitlines() if " in " in line and ("passed" in line or "failed" in line
                                                                       or "error" in line)]
    if tail:
        for n, what in _COUNTS.findall(tail[-1]):
            out[what.rstrip("s") if what.startswith("error") else what] = int(n)
    found = _EXAMPLES.findall(text)
    if found:
        out["hypothesis_examples"] = sum(int(a) + int(b) for a, b in found)
    san = _SANITIZER.findall(text)
    if san:
        out["sanitizer_errors"] = sum(int(n) if n != "?" else 1 for n in san)
    failed = sorted(set(_FAILED.findall(text)))  # -v progress lines and the -ra summary
    if failed:
        out["failed_tests"] = failed
    ex = _EXAMPLE_RUN.findall(text)
    if ex:
        out["examples_run"] = len(ex)
        out["examples_failed"] = [e for e, code in ex if code != "0"]
    return out


def example_job(names, launcher=None):
    """A bash job running examples one after another; ``launcher``: what runs each
    (default: this Python)."""
    run_with = launcher or PY
    script = "; ".join(f'echo "== example {n}"; {run_with} examples/{n}; echo "== example {n} exit $?"'
                       for n in names)
    return ["bash", "-c", script]


def torchrun():
    """The torchrun beside this Python (or on PATH), or None."""
    here = Path(PY).with_name("torchrun")
    found = str(here) if here.exists() else shutil.which("torchrun")
    return f"{found} --standalone --nproc_per_node=1" if found else None


def jobs(args, log_dir):
    """Phase 1 jobs: (name, command, limit, env)."""
    suite = [p for p in sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
             if p not in OWN_JOBS]
    # the full tier: the quick one leaves tool runs and slow properties to it (tests/conftest.py)
    out = [("suite", PYTEST + ["-n", str(args.suite_workers), "-v", "--full",
                               "--hypothesis-profile=gpu"] + suite,
            args.limit,
            {"NUMBA_SOFTMAX_GPU_EXAMPLES": str(args.suite_examples)}),
           ("reliability", PYTEST + ["tests/test_reliability.py"], args.limit, None)]
    for gpu in filter(None, getattr(args, "emulate", "").split(",")):
        out.append((f"suite-as-{gpu}", out[0][1], args.limit,
                    {"NUMBA_SOFTMAX_GPU_EXAMPLES": str(args.suite_examples),
                     "NUMBA_SOFTMAX_TEST_AS": gpu}))
    for shard in range(args.fuzz_first_seed, args.fuzz_first_seed + args.fuzz_shards):
        out.append((f"fuzz-{shard}", PYTEST + [
            "--hypothesis-profile=fuzz", f"--hypothesis-seed={1000 + shard}",
            "--hypothesis-show-statistics", "tests/test_fuzz.py"], args.limit,
            {"NUMBA_SOFTMAX_FUZZ_EXAMPLES": str(args.fuzz_examples)}))
    untimed = sorted(p.name for p in (ROOT / "examples").glob("[0-9]*.py")
                     if p.name not in TIMED_EXAMPLES)
    out.append(("examples", example_job(untimed), args.limit, None))
    if not args.skip_sanitizers:
        for tool in TOOLS:
            out.append((f"sanitize-{tool}", [PY, "scripts/sanitize.py", "--tool", tool,
                                             "--timeout", str(args.limit - 15),
                                             "--log-dir", str(log_dir / "sanitize")],
                        args.limit, None))
    return out


def summary(env, results):
    failed = []
    for r in results:
        bad = (r["exit"] != 0 or r.get("failed", 0) or r.get("error", 0)
               or r.get("sanitizer_errors", 0) or r.get("examples_failed"))
        if bad:
            failed.append(r["name"] + (" (timed out)" if r["exit"] == 124 else ""))
    fuzz = sum(r.get("hypothesis_examples", 0) for r in results if r["name"].startswith("fuzz"))
    lines = [f"GPU check on {env['device']} (driver {env['driver']}), {env['date']}",
             f"tree {env['git_hash'] or '?'}, package source {env['source_hash'][:16]}",
             f"numba {env['numba']}, numba-cuda {env['numba_cuda']}, numpy {env['numpy']}, "
             f"cupy {env['cupy']}, torch {env['torch']}, Python {env['python']}", "",
             f"{'job':<22}{'exit':>5}{'passed':>8}{'failed':>8}{'skipped':>8}{'examples':>10}"
             f"{'sanitizer':>10}{'seconds':>9}"]
    for r in results:
        ex = r.get("hypothesis_examples", r.get("examples_run", ""))
        lines.append(f"{r['name']:<22}{r['exit']:>5}{r.get('passed', ''):>8}{r.get('failed', ''):>8}"
                     f"{r.get('skipped', ''):>8}{ex:>10}{r.get('sanitizer_errors', ''):>10}"
                     f"{r['seconds']:>9}")
    lines += ["", f"fuzz cases generated: {fuzz}"]
    for part in env.get("merged", []):
        lines.append(f"merged: {', '.join(part['jobs'])} from the run of {part['date']} on tree "
                     f"{part['git_hash']} (the same package source)")
    for r in results:
        for t in r.get("failed_tests", []):
            lines.append(f"failed in {r['name']}: {t}")
        for e in r.get("examples_failed", []) or []:
            lines.append(f"failed in {r['name']}: examples/{e}")
    verdict = "GPU CHECK: PASS" if not failed else f"GPU CHECK: FAIL ({', '.join(failed)})"
    return lines + [verdict], not failed, fuzz


def merged(env, results, earlier):
    """This run's jobs, then the earlier record's jobs of names this run did not use;
    the parts are listed in ``env["merged"]``.  Only records of the same package source
    (and device) merge: a check in parts is still a check of one package."""
    if earlier.get("source_hash") != env["source_hash"] or earlier.get("device") != env["device"]:
        raise SystemExit(f"--merge: {earlier.get('git_hash')} ran another package source or "
                         f"device; run the whole check instead")
    names = {r["name"] for r in results}
    kept = [r for r in earlier["jobs"] if r["name"] not in names]
    parts = [p for p in earlier.get("merged", []) if set(p["jobs"]) & {r["name"] for r in kept}]
    own = [r["name"] for r in kept if not any(r["name"] in p["jobs"] for p in parts)]
    if own:
        parts.append({"git_hash": earlier.get("git_hash"), "date": earlier.get("date"), "jobs": own})
    env["merged"] = parts
    return results + kept


# Generated cases a shard per example a test of tests/test_fuzz.py on a GPU with CuPy and
# PyTorch, as the record counts them (Hypothesis stops short of max_examples where a test's
# space is small): 1000 cases a shard at 100 examples, 1400 at 140, in the H100 record.
FUZZ_TESTS_ON_GPU = 10


def parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "build" / "gpu-check"), help="logs and the record")
    p.add_argument("--git-hash", default=os.environ.get("GIT_HASH"), help="the tree's commit")
    p.add_argument("--only", help="comma-separated job name prefixes (default: all)")
    p.add_argument("--fuzz-shards", type=int, default=8,
                   help="fuzz processes, one seed each (default 8: at 140 examples a test, about "
                        "1400 cases a shard on a GPU with CuPy and PyTorch, 11,200 in all)")
    p.add_argument("--fuzz-examples", type=int, default=140,
                   help="Hypothesis examples per fuzz test per shard (default 140)")
    p.add_argument("--suite-workers", type=int, default=6,
                   help="pytest-xdist workers of the suite job (more where it runs beside few jobs: "
                   "--only suite,reliability,examples)")
    p.add_argument("--suite-examples", type=int, default=40,
                   help="Hypothesis examples per test in the suite job (the fuzz draws the many)")
    p.add_argument("--as", dest="emulate", default="", metavar="GPUS",
                   help="comma-separated (a100, ada): also the suite with each one's launch limits")
    p.add_argument("--timed-limit", type=int, default=90, help="seconds per timed example")
    p.add_argument("--limit", type=int, default=380, help="seconds per phase-1 job")
    p.add_argument("--workers", type=int, default=None,
                   help="phase-1 jobs run at once (default: all of them; a job queued behind "
                        "others adds its whole time to the run's)")
    p.add_argument("--skip-sanitizers", action="store_true")
    p.add_argument("--skip-timed", action="store_true")
    p.add_argument("--fuzz-first-seed", type=int, default=0,
                   help="shard i uses Hypothesis seed 1000 + i from here (a second part draws new cases)")
    p.add_argument("--merge", metavar="RECORD.json",
                   help="a record of an earlier run of the same package source: its jobs this run "
                        "did not run are kept (a check made in parts, e.g. on a device lent "
                        "10 minutes at a time); refused if the package source differs")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    log_dir = Path(args.out)
    log_dir.mkdir(parents=True, exist_ok=True)
    if args.git_hash is None:
        git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        args.git_hash = git.stdout.strip() or None
    env = environment(args.git_hash)
    todo = jobs(args, log_dir)
    if args.only:
        keep = tuple(args.only.split(","))
        todo = [j for j in todo if j[0].startswith(keep)]
    with ThreadPoolExecutor(max_workers=args.workers or max(1, len(todo))) as pool:  # phase 1: correctness
        results = list(pool.map(lambda j: run(j[0], j[1], log_dir, j[2], j[3]), todo))
    if not args.skip_timed and (not args.only or "timed" in args.only):
        for name in TIMED_EXAMPLES:  # phase 2: alone
            results.append(run(f"timed-{name[:2]}", example_job([name]), log_dir, args.timed_limit))
        if torchrun():  # the ring through torch.distributed + NCCL, one rank
            results.append(run("timed-10-torchrun", example_job(["10_ring_attention.py"], torchrun()),
                               log_dir, args.timed_limit))
    if args.merge:
        results = merged(env, results, json.loads(Path(args.merge).read_text()))
    lines, ok, fuzz = summary(env, results)
    text = "\n".join(lines)
    print(text)
    slug = re.sub(r"[^a-z0-9]+", "-", env["device"].lower()).strip("-") or "gpu"
    (log_dir / f"gpu-check-{slug}.txt").write_text(text + "\n")
    record = {**env, "jobs": results, "fuzz_cases": fuzz, "verdict": lines[-1]}
    (log_dir / f"gpu-check-{slug}.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
