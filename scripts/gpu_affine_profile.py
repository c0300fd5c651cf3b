"""Launch the affine quantize kernel once for K and once for V (fp16 [8, 8, 32768, 128], 3 bits,
G = 64, default tiles) after a warm-up, for a profiler to read:

    ncu --clock-control none -k regex:_quantize_kernel -s 2 -c 2 --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats --section LaunchStats \\
        python3 scripts/gpu_affine_profile.py

(``-s 2`` skips the warm-up launches, which compile.) Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPE = (8, 8, 32768, 128)


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog="gpu_affine_profile.py", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(argv)
    import torch

    from kvbits.affine import _launch_quantize
    from kvbits.kv_cache import QuantizedKV

    b, h, s, d = SHAPE
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(SHAPE, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(SHAPE, device="cuda", dtype=torch.float16, generator=gen)
    qkv = QuantizedKV.empty(b, h, d, bits=3, group_size=64, capacity=s, dtype=torch.float16, device="cuda")
    for _ in range(2):  # the first pass compiles; a profiler skips it
        _launch_quantize(k, qkv.k_codes, qkv.k_scale, qkv.k_zero, 0, 64, 3, True)
        _launch_quantize(v, qkv.v_codes, qkv.v_scale, qkv.v_zero, 0, 64, 3, False)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
