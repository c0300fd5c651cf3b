#!/usr/bin/env bash
# One GPU visit for the launch-shape sweeps: the 3-bit unpack/pack kernels of a 1 GiB stream
# (scripts/gpu_packing_sweep.py) and the affine quantize tiles on fp16 [8, 8, 32768, 128]
# (scripts/gpu_affine_sweep.py), each against the copy bandwidth measured in its run, one after
# the other so that neither disturbs the other's timings.
#
#   bash scripts/gpu_sweeps.sh
#
# Results: $OUT (else reports/sweeps)/packing_sweep.json, affine_sweep.json and the two logs;
# each sweep's best rows printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # compiled Triton on the GPU
out="${OUT:-reports/sweeps}"
mkdir -p "$out"
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader || true
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for sweep in packing affine; do
  start=$(date +%s)
  python3 "scripts/gpu_${sweep}_sweep.py" --out "$out" >"$out/${sweep}_sweep.log" 2>&1 || status=1
  echo "[sweeps] $sweep: exit $status after $(( $(date +%s) - start )) s"
done
for sweep in packing affine; do
  echo "== $sweep"
  grep -E "WRONG|Error|Traceback" "$out/${sweep}_sweep.log" | head -5
  sed -n '/^copy /,$p' "$out/${sweep}_sweep.log"
  tail -3 "$out/${sweep}_sweep.log"
done
exit "$status"
