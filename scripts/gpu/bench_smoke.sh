#!/usr/bin/env bash
# The benchmark's quick form on a GPU: `numba-softmax bench --quick --out $OUT/bench`, with
# the tables on stdout (the bench prints them; its per-case progress goes to
# $OUT/bench/progress.log).  Budget: <= 200 s on an H100 including JIT compilation; the
# bench prints the seconds of each section and the total.
# Exit status: the bench's (0 ok, 1 some case failed, 3 an impossible figure stopped it).
# Usage: scripts/gpu/bench_smoke.sh            (OUT defaults to a fresh temporary folder)
set -u
cd "$(dirname "$0")/../.."
out="${OUT:-$(mktemp -d)}/bench"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
start=$(date +%s)
timeout "${BENCH_TIMEOUT:-290}" python3 -m numba_softmax bench --quick --out "$out" \
    2> "$out/progress.log"
rc=$?
echo
echo "bench_smoke: exit $rc after $(( $(date +%s) - start )) s wall; outputs in $out"
if [ "$rc" -ne 0 ]; then  # what went wrong: the last lines of progress and tracebacks
    echo "--- last lines of $out/progress.log"
    tail -n 40 "$out/progress.log"
fi
exit "$rc"
