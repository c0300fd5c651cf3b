#!/usr/bin/env bash
# INT8 per-channel quantization on a GPU box: compile checks, the 25 test categories of
# GPU-Accelerated KV Cache Quantization on every variant, then the ten-shape benchmark, and the
# speedup table built from its records.
#
#   bash scripts/gpu_int8.sh [results-dir]      (default reports/runs/int8-<UTC time>)
#
# Each step is its own pytest run so that one stays well inside a 10-minute command limit; the
# benchmark alone takes a few minutes on an H200 (torch.compile builds and the CPU baseline).
set -euo pipefail
cd "$(dirname "$0")/.."
results="${1:-reports/runs/int8-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$results"

TRITON_INTERPRET=0 python - <<'PY'
from kvbits.aot import compile_spec
from kvbits.int8 import AOT_SPECS
for spec in AOT_SPECS:
    compile_spec(spec, 90)
print(f"{len(AOT_SPECS)} int8 Triton kernels compiled for sm_90")
PY
python -m pytest suites/test_int8_*.py -q -p no:cacheprovider --results-dir "$results/tests"
python -m pytest suites/test_bench_int8.py -m bench -q -p no:cacheprovider --results-dir "$results/bench"
python scripts/int8_table.py "$results/bench/records.jsonl" | tee "$results/int8_table.md"
