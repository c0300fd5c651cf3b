#!/usr/bin/env bash
# One GPU visit for the fault side of the harness: the crash-isolation tests on the GPU (an
# illegal address costs one test), every planted bug of harness/checks/mutant_catalogue.py
# against the compiled kernels, compute-sanitizer over every GPU kernel, one report over both.
#
#   bash scripts/gpu_faults.sh [LIMIT_S]
#
# LIMIT_S (default 540) caps the whole mutation + sanitizer step; records land per mutant, so a
# capped run still reports every finished one. Results: $OUT (else reports/faults)/faults.tgz
# (records, report, JUnit) and the logs beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
final="${OUT:-reports/faults}"
mkdir -p "$final"
limit="${1:-540}"
work="$(mktemp -d)"
export KVH_EXT_DIR="$work/ext" KVH_MUTANT_JOBS="${KVH_MUTANT_JOBS:-$(( $(nproc) / 2 ))}"
start=$(date +%s)

python3 -m pytest tests/test_crash_isolation.py -p no:cacheprovider -q -rA --results-dir "$work/crash" \
  >"$final/crash.log" 2>&1
echo "[faults] crash isolation: exit $? ($(tail -1 "$final/crash.log"))"

left=$(( limit - ($(date +%s) - start) ))
if [ "$left" -gt 0 ]; then  # `timeout 0` would mean no limit at all
  OUT="$work" timeout -s INT "$left" bash scripts/gpu_mutants.sh all >"$final/mutants.log" 2>&1
  echo "[faults] mutants + sanitizer: exit $?"
else
  echo "[faults] mutants + sanitizer: SKIPPED, no time left of the ${limit} s limit" | tee "$final/mutants.log"
fi
OUT="$work" bash scripts/gpu_mutants.sh report >>"$final/mutants.log" 2>&1
grep -E "killed|survived|sanitiz|kill rate|mutants" "$final/mutants.log" | tail -25
tar czf "$final/faults.tgz" -C "$work" --exclude ext .
echo "[faults] $(( $(date +%s) - start )) s"
