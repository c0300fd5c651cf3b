#!/usr/bin/env bash
# Wall times of `nox -s gpu_verify --no-venv` on this GPU box: the suites cold (fresh CUDA
# extension and Triton caches) over every GPU, then warm on GPU 0 alone and warm over every GPU,
# then the benchmarks (`nox -s bench --no-venv`), each report kept. Prints a table last.
#
#   bash scripts/gpu_verify_walls.sh [BENCH_LIMIT_S]
#
# BENCH_LIMIT_S (default 100) caps the benchmark step; its records land as each case ends, so a
# capped step still leaves every finished case. Results: $OUT (else reports/walls)/walls.tgz with
# each run's reports directory, and walls.md with the table. Needs nox importable (`python3 -m nox`).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
out="${OUT:-reports/walls}"
mkdir -p "$out"
bench_limit="${1:-100}"
work="$(mktemp -d)"
export KVH_EXT_DIR="$work/ext" TRITON_CACHE_DIR="$work/triton"
all_gpus="$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)"
rows=()

run() {  # run NAME GPUS LIMIT SESSION [args]
  local name="$1" gpus="$2" limit="$3" session="$4"
  shift 4
  local start end rc
  start=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES="$gpus" timeout -s INT "$limit" python3 -m nox --no-venv -s "$session" -- \
    --reports-dir "$work/$name" "$@" >"$out/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  local wall
  wall=$(python3 -c "print(f'{$end - $start:.1f}')")
  local counts
  counts=$(grep -hoE "[0-9]+ (passed|failed|skipped|error)" "$out/$name.log" | tail -4 | paste -sd' ' -)
  rows+=("| $name | $gpus | $session | $rc | $wall | $counts |")
  echo "[walls] $name: exit $rc after $wall s ($counts)"
}

nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
python3 -c "import os, torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cpus', os.cpu_count())"
run suites-cold-all "$all_gpus" 200 gpu_verify --no-bench
run suites-warm-gpu0 0 150 gpu_verify --no-bench
run suites-warm-all "$all_gpus" 120 gpu_verify --no-bench
run bench-gpu0 0 "$bench_limit" bench

{
  echo "| run | CUDA_VISIBLE_DEVICES | session | exit | wall s | pytest |"
  echo "| --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
} >"$out/walls.md"
tar czf "$out/walls.tgz" -C "$work" --exclude ext --exclude triton .
cat "$out/walls.md"
