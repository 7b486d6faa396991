#!/usr/bin/env bash
# Every check this project runs on a GPU, in parallel processes (one GPU, many CPU cores):
# the test suite with the GPU Hypothesis profile, the reliability tests (streams, huge
# inputs), the long fuzz run (seed 12345), every example in its GPU form and
# compute-sanitizer's four tools.
# Usage: scripts/gpu_check.sh [LOG_DIR]      (default build/gpu-check); prints a summary.
set -u
cd "$(dirname "$0")/.."
logs=${1:-build/gpu-check}
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
limit=${GPU_CHECK_TIMEOUT:-540}
pids=()
run() { name=$1; shift; ( timeout "$limit" "$@" > "$logs/$name.log" 2>&1; echo "exit $?" >> "$logs/$name.log" ) & pids+=($!); }

run suite python3 -m pytest -q -p no:cacheprovider --hypothesis-profile=gpu \
    tests/test_softmax.py tests/test_combine.py tests/test_attention.py tests/test_cli.py
run reliability python3 -m pytest -q -p no:cacheprovider tests/test_reliability.py
run fuzz python3 -m pytest -q -p no:cacheprovider --hypothesis-profile=fuzz \
    --hypothesis-seed=12345 --hypothesis-show-statistics tests/test_fuzz.py
run examples bash -c 'for f in examples/0*.py; do echo "== $f"; python3 "$f" || exit 1; done'
for tool in memcheck racecheck synccheck initcheck; do
    run "sanitize-$tool" python3 scripts/sanitize.py --tool "$tool" --log-dir build/sanitize
done
wait "${pids[@]}"

for f in "$logs"/*.log; do
    printf '== %s: ' "$(basename "$f" .log)"
    grep -E "passed|failed|errors?|ERROR SUMMARY|verdict" "$f" | tail -n 3 | tr '\n' ' '
    tail -n 1 "$f"
done
