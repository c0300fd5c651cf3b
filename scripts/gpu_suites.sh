#!/usr/bin/env bash
# One visit to a GPU machine: compile every kernel, run the given pytest selection with
# records under $OUT/run (or reports/runs/gpu), render the report beside it.
# Usage: scripts/gpu_suites.sh [pytest args...]
set -uo pipefail
export PYTHONUNBUFFERED=1 KVH_EXT_DIR="${KVH_EXT_DIR:-/tmp/kvh_ext}"
out="${OUT:-reports/runs}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
TRITON_INTERPRET=0 python -m kvbits.aot --arch 90 | tail -4
python -m harness.compile.compile_cuda | grep -E "^(ok|FAIL)|failure" || true
python -m pytest "$@" -p no:cacheprovider --results-dir "$out/run" -q -rfE --timeout 300 2>&1 | tail -80
status=${PIPESTATUS[0]}
python -m harness report "$out/run" -o "$out/report.html" --junit "$out/junit.xml" --summary-md "$out/summary.md" | tail -15
exit "$status"
