#!/usr/bin/env bash
# Wall times of `nox -s gpu_verify --no-venv` on this GPU box: the suites cold (fresh CUDA
# extension and Triton caches) over every GPU, the suites warm over every GPU and on GPU 0
# alone (the spread), then the whole gpu_verify (suites, headline benchmarks, report) warm on
# GPU 0; each report kept, a table printed last with where each suites step's time went
# outside its tests (the run timeline: process start, collection, first and last test).
#
#   bash scripts/gpu_verify_walls.sh [FULL_LIMIT_S]
#
# KVH_WALL_RUNS picks the runs and their order (default "suites-cold-all suites-warm-all
# suites-warm-gpu0 full-warm-gpu0"; suites-cold-gpu0 is the cold suites on GPU 0 alone), each
# name once; a name ending in -wN (suites-warm-gpu0-w1) runs with N pytest-xdist workers per GPU
# instead of the default. Each cold run starts from empty caches of its own; a warm run uses the
# last cold run's, so a warm run needs a cold run before it.
#
# FULL_LIMIT_S (default 250) caps the last run; records land as each case ends, so a capped
# run still leaves every finished case. Results: $OUT (else reports/walls)/walls.tgz with each
# run's reports directory, the logs, and walls.md with the table. Needs `python3 -m nox`.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
out="${OUT:-reports/walls}"
mkdir -p "$out"
full_limit="${1:-250}"
work="$(mktemp -d)"
cache=""  # the warm runs' caches: the last cold run's
runs="${KVH_WALL_RUNS:-suites-cold-all suites-warm-all suites-warm-gpu0 full-warm-gpu0}"
seen=" "
base_of() {  # a run's name without its -wN workers suffix
  local name="$1"
  if [[ "$name" =~ ^(.*)-w[1-9][0-9]*$ ]]; then echo "${BASH_REMATCH[1]}"; else echo "$name"; fi
}
workers_of() {  # the --workers-per-gpu arguments of a run's -wN suffix (none without one)
  if [[ "$1" =~ -w([1-9][0-9]*)$ ]]; then echo "--workers-per-gpu ${BASH_REMATCH[1]}"; fi
}
for name in $runs; do  # check the list before spending GPU time on it
  case "$(base_of "$name")" in
    suites-cold-all | suites-cold-gpu0) seen="$seen$name " ;;
    suites-warm-all | suites-warm-gpu0 | full-warm-gpu0)
      case "$seen" in
        *cold*) seen="$seen$name " ;;
        *) echo "KVH_WALL_RUNS: warm run '$name' before any cold run" >&2; exit 2 ;;
      esac ;;
    *) echo "KVH_WALL_RUNS: unknown run '$name'" >&2; exit 2 ;;
  esac
done
if [ "$(printf '%s\n' $runs | sort | uniq -d)" != "" ]; then
  echo "KVH_WALL_RUNS: each run once; got '$runs'" >&2
  exit 2
fi
all_gpus="$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)"
rows=()

run() {  # run NAME GPUS LIMIT SESSION [args]
  local name="$1" gpus="$2" limit="$3" session="$4"
  shift 4
  local start end rc
  case "$name" in *cold*) cache="$work/cache-$name" && rm -rf "$cache" ;; esac
  mkdir -p "$cache"
  start=$(date +%s.%N)
  KVH_EXT_DIR="$cache/ext" TRITON_CACHE_DIR="$cache/triton" CUDA_VISIBLE_DEVICES="$gpus" timeout -s INT "$limit" python3 -m nox --no-venv -s "$session" -- \
    --reports-dir "$work/$name" "$@" >"$out/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  local wall
  wall=$(python3 -c "print(f'{$end - $start:.1f}')")
  local counts
  counts=$(grep -hoE "[0-9]+ (passed|failed|skipped|error)" "$out/$name.log" | tail -4 | paste -sd' ' -)
  local steps
  steps=$(grep -E "^      (suites|benchmarks|report) " "$out/$name.log" | awk '{print $1 " " $(NF-1) " s"}' | paste -sd, -)
  local where
  where=$(grep -hoE "\[kvh\] suites: first test at .*" "$out/$name.log" | tail -1 | sed 's/^\[kvh\] suites: //')
  local compiles
  compiles=$(grep -hoE "\[kvh\] suites: Triton kernels .*" "$out/$name.log" | tail -1 | sed 's/^\[kvh\] suites: Triton kernels //')
  rows+=("| $name | $gpus | $session $* | $rc | $wall | $steps | $counts | $where | ${compiles:--} |")
  echo "[walls] $name: exit $rc after $wall s ($counts)"
}

nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
python3 -c "import os, torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cpus', os.cpu_count())"
for name in $runs; do
  # shellcheck disable=SC2046  # the workers arguments are meant to split
  case "$(base_of "$name")" in
    suites-cold-all) run "$name" "$all_gpus" 180 gpu_verify --no-bench $(workers_of "$name") ;;
    suites-cold-gpu0) run "$name" 0 240 gpu_verify --no-bench $(workers_of "$name") ;;
    suites-warm-all) run "$name" "$all_gpus" 150 gpu_verify --no-bench $(workers_of "$name") ;;
    suites-warm-gpu0) run "$name" 0 150 gpu_verify --no-bench $(workers_of "$name") ;;
    full-warm-gpu0) run "$name" 0 "$full_limit" gpu_verify $(workers_of "$name") ;;
  esac
done

{
  echo "| run | CUDA_VISIBLE_DEVICES | session | exit | wall s | steps | pytest | suites timeline | Triton kernels |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
} >"$out/walls.md"
tar czf "$out/walls.tgz" -C "$work" --exclude 'cache-*' .
cat "$out/walls.md"
