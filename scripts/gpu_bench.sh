#!/usr/bin/env bash
# Every benchmark on this GPU box through `nox -s bench --no-venv`, then the INT8 speedup table.
#
#   bash scripts/gpu_bench.sh [LIMIT_S] [pytest args...]
#
# LIMIT_S (default 540) caps the benchmark step; records land as each case ends. The INT8 C++ CPU
# baseline is timed on every shape predicted to take at most KVH_INT8_CPU_LIMIT_S (default here
# 60 s). Results: $OUT (else reports/bench)/bench.tgz (records, report, JUnit), int8_table.md,
# summary.md and the log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 KVH_INT8_CPU_LIMIT_S="${KVH_INT8_CPU_LIMIT_S:-60}"
final="${OUT:-reports/bench}"
mkdir -p "$final"
limit="${1:-540}"
shift || true
work="$(mktemp -d)"
export KVH_EXT_DIR="$work/ext"
timeout -s INT "$limit" python3 -m nox --no-venv -s bench -- --reports-dir "$work/reports" "$@" \
  >"$final/bench.log" 2>&1
echo "[bench] exit $?"
records=$(ls "$work"/reports/runs/*/records.jsonl 2>/dev/null | head -1)
[ -n "$records" ] && python3 scripts/int8_table.py "$records" >"$final/int8_table.md"
cp "$work/reports/bench-summary.md" "$final/summary.md" 2>/dev/null
tar czf "$final/bench.tgz" -C "$work" --exclude ext reports
grep -E "^\[kvh\]|passed|failed" "$final/bench.log" | tail -12
