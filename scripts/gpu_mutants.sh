#!/usr/bin/env bash
# On a GPU box: every planted bug of harness/checks/mutant_catalogue.py compiled on the GPU
# (CUDA-source and compiled-Triton mutants included), then compute-sanitizer memcheck, racecheck
# and initcheck over every GPU kernel (harness/checks/sanitize.py), and one report over both.
#
#   bash scripts/gpu_mutants.sh [PART] [more harness.checks.mutants options]
#
# PART: all (default), or one slice that fits a 10-minute command limit on its own:
#   packing | int8 | affine | decode | read-floor   the mutants of those files (see PARTS)
#   sanitize                                        compute-sanitizer only
#   report                                          re-render the report from what earlier parts left
#   parts                                           print PARTS and exit
# Results: $OUT (else reports/runs)/gpu-mutants-<part>/ and gpu-sanitize/, the report at
# $OUT/mutants-report.html. Environment: KVH_MUTANT_JOBS (parallel mutants, default 4),
# KVH_EXT_DIR (CUDA extension builds, default /tmp/kvh_ext, kept across parts),
# KVH_SANITIZE_JOBS (kernels under the sanitizer at once, default 4), KVH_SANITIZE_KERNELS
# (a space-separated subset of `python -m harness.checks.sanitize --list`, default every kernel),
# COMPUTE_SANITIZER (the executable when it is not on PATH or in /usr/local/cuda*/bin).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 KVH_EXT_DIR="${KVH_EXT_DIR:-/tmp/kvh_ext}"
unset TRITON_INTERPRET  # compiled Triton on the GPU
out="${OUT:-reports/runs}"
part="${1:-all}"
shift || true
jobs="${KVH_MUTANT_JOBS:-4}"
status=0

# The mutant parts: a name, then the --match texts that pick its mutants. Together they pick every
# mutant of the catalogue, each in one part (tests/test_scripts.py checks it).
PARTS=(
  "packing packing.py pack3.cu"
  "int8 int8"
  "affine affine.py kv_cache.py"
  "decode decode/"
  "read-floor read_floor.py"
)

part_matches() {  # part_matches NAME: the --match texts of that part (status 1 when there is none)
  local entry
  for entry in "${PARTS[@]}"; do
    if [ "${entry%% *}" = "$1" ]; then
      echo "${entry#* }"
      return 0
    fi
  done
  return 1
}

mutants() {  # mutants NAME MATCH...
  local name="$1"
  shift
  rm -rf "$out/gpu-mutants-$name"
  python -m harness.checks.mutants --jobs "$jobs" --results-dir "$out/gpu-mutants-$name" --match "$@" \
    ${EXTRA:+$EXTRA} || status=1
}

sanitize() {
  rm -rf "$out/gpu-sanitize"
  # shellcheck disable=SC2086  # KVH_SANITIZE_KERNELS is a list of names
  python -m harness.checks.sanitize --results-dir "$out/gpu-sanitize" --jobs "${KVH_SANITIZE_JOBS:-4}" \
    ${KVH_SANITIZE_KERNELS:+--kernels $KVH_SANITIZE_KERNELS} || status=1
}

report() {
  local dirs=("$out"/gpu-mutants-* "$out"/gpu-sanitize)
  local found=()
  for d in "${dirs[@]}"; do [ -d "$d" ] && found+=("$d"); done
  if [ "${#found[@]}" -eq 0 ]; then
    echo "no gpu-mutants-* or gpu-sanitize run under $out to report" >&2
    return 1
  fi
  python -m harness report "${found[@]}" -o "$out/mutants-report.html" --junit "$out/mutants-junit.xml" \
    --summary-md "$out/mutants-summary.md" | tail -20
}

case "$part" in
  parts)
    printf '%s\n' "${PARTS[@]}"
    exit 0
    ;;
  all | sanitize | report) ;;
  *)
    if ! part_matches "$part" >/dev/null; then
      echo "unknown part '$part': all, $(printf '%s, ' "${PARTS[@]%% *}")sanitize, report or parts" >&2
      exit 2
    fi
    ;;
esac

EXTRA="$*"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"

case "$part" in
  sanitize) sanitize ;;
  report) ;;
  all)
    for entry in "${PARTS[@]}"; do
      # shellcheck disable=SC2086  # a part's name and texts, one word each
      mutants $entry
    done
    sanitize
    ;;
  *)
    # shellcheck disable=SC2046  # the part's texts, one word each
    mutants "$part" $(part_matches "$part")
    ;;
esac
report || status=1
exit "$status"
