#!/usr/bin/env bash
# One GPU visit for the launch-shape sweeps: the 3-bit unpack/pack kernels of a 1 GiB stream
# (scripts/gpu_packing_sweep.py) and the 3-bit affine quantize tiles on fp16 [8, 8, 32768, 128]
# at G = 32, 64 and 128 (scripts/gpu_affine_sweep.py), each against the copy bandwidth measured
# in its run, one after the other so that none disturbs another's timings.
#
#   bash scripts/gpu_sweeps.sh
#
# Results: $OUT (else reports/sweeps)/packing_sweep.json, affine_sweep_b3_g{32,64,128}.json and
# the logs; each sweep's best rows printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # compiled Triton on the GPU
out="${OUT:-reports/sweeps}"
mkdir -p "$out"
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader || true
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
sweep() {  # sweep NAME SCRIPT [args]
  local name="$1" script="$2" start rc
  shift 2
  start=$(date +%s)
  python3 "$script" --out "$out" "$@" >"$out/$name.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || status=1
  echo "[sweeps] $name: exit $rc after $(( $(date +%s) - start )) s"
}
sweep packing_sweep scripts/gpu_packing_sweep.py
for g in 64 32 128; do
  sweep "affine_sweep_b3_g$g" scripts/gpu_affine_sweep.py --bits 3 --group-size "$g"
done
for log in "$out"/packing_sweep.log "$out"/affine_sweep_b3_g*.log; do
  echo "== $(basename "$log" .log)"
  grep -E "WRONG|Error|Traceback" "$log" | head -5
  sed -n '/^copy /,$p' "$log"
done
exit "$status"
