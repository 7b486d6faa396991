#!/usr/bin/env bash
# The long fuzz run of docs/reliability.md, on a GPU: 2000 examples per test (14,000 or
# more in all), a fixed seed, Hypothesis' statistics (examples run per test) at the end.
#
#   scripts/fuzz.sh                 # seed 12345
#   SEED=7 scripts/fuzz.sh -x       # another seed; extra arguments go to pytest
#
# A failure prints the drawn example; Hypothesis also keeps it in .hypothesis/ and tries
# it first next time.  The log is kept in build/fuzz-SEED.log.
set -euo pipefail
cd "$(dirname "$0")/.."
SEED="${SEED:-12345}"
PYTHON="${PYTHON:-python}"
mkdir -p build
"$PYTHON" -m pytest tests/test_fuzz.py --hypothesis-profile=fuzz --hypothesis-seed="$SEED" \
    --hypothesis-show-statistics --durations=10 -ra "$@" 2>&1 | tee "build/fuzz-$SEED.log"
exit "${PIPESTATUS[0]}"
