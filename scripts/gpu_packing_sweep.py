"""Launch-shape sweep of the 3-bit unpack/pack kernels on a GPU, against the copy and write-only
ceilings measured in the same run: where the 1 GiB unpack loses its bandwidth.

    PYTHONUNBUFFERED=1 python scripts/gpu_packing_sweep.py [--out DIR] [--gib 1]

Triton: the library's byte and word kernels at several values-per-program and warp counts.
CUDA: an experimental unpack (below) where each thread takes QUADS consecutive 12-byte quads
with 16-byte loads and stores (more bytes in flight than the library kernel's one quad), at
several QUADS and grid sizes; the library kernel beside it. Every variant's output is compared
with the library's torch reference before it is timed. Writes packing_sweep.json under --out
(default $OUT or reports/packing) and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

from harness.measure.timing import (  # noqa: E402
    bandwidth_metrics,
    copy_bandwidth_gbps,
    median_ms,
    write_bandwidth_gbps,
)
from kvbits import pack_bits, packing, unpack_bits  # noqa: E402

# The experiment is compiled in one unit after the library's pack3.cu, whose lane helpers it uses.
EXPERIMENT_CU = r"""
namespace {
// QUADS consecutive quads per thread (QUADS % 4 == 0: 3 * QUADS words = QUADS / 4 * 3 uint4 loads).
template <int QUADS>
__global__ void unpack3_wide(const uint4* __restrict__ packed, uint4* __restrict__ values, int64_t n_units) {
    constexpr int kLoads = QUADS / 4 * 3;
    for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n_units;
         u += int64_t(gridDim.x) * blockDim.x) {
        uint32_t w[3 * QUADS];
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
            const uint4 v = __ldg(packed + u * kLoads + i);
            w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
        }
#pragma unroll
        for (int q = 0; q < QUADS; ++q) {
            uint32_t out[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            unpack_lanes<0>(w[3 * q], w[3 * q + 1], w[3 * q + 2], out);
            values[(u * QUADS + q) * 2] = make_uint4(out[0], out[1], out[2], out[3]);
            values[(u * QUADS + q) * 2 + 1] = make_uint4(out[4], out[5], out[6], out[7]);
        }
    }
}

}  // namespace

torch::Tensor unpack3_sweep(torch::Tensor packed, int64_t quads, int64_t blocks, int64_t threads) {
    const int64_t n_units = packed.numel() / (12 * quads);
    TORCH_CHECK(packed.numel() == n_units * 12 * quads, "packed must hold whole units of QUADS quads");
    auto values = torch::empty({packed.numel() / 3 * 8}, packed.options());
    auto stream = at::cuda::getCurrentCUDAStream();
    auto in = reinterpret_cast<const uint4*>(packed.data_ptr<uint8_t>());
    auto out = reinterpret_cast<uint4*>(values.data_ptr<uint8_t>());
    switch (quads) {
        case 4: unpack3_wide<4><<<blocks, threads, 0, stream>>>(in, out, n_units); break;
        case 8: unpack3_wide<8><<<blocks, threads, 0, stream>>>(in, out, n_units); break;
        default: TORCH_CHECK(false, "quads must be 4 or 8");
    }
    return values;
}
"""


def triton_variants(packed: torch.Tensor, values: torch.Tensor):
    """(name, fn) for the library's Triton kernels at several launch shapes."""
    n_bytes = packed.numel()
    for layout in ("byte", "word"):
        geo = packing.geometry(3, layout)
        n_groups = n_bytes // (geo.units * (1 if layout == "byte" else 4))
        src_unpack = packed if layout == "byte" else packed.view(torch.int32)
        if layout == "byte":
            unpack_kernel, pack_kernel = packing._unpack_bytes_kernel, packing._pack_bytes_kernel
            meta = packing._byte_kernel_args(geo)
        else:
            unpack_kernel, pack_kernel = packing._unpack_words_kernel, packing._pack_words_kernel
            meta = {"BITS": 3, "NV": geo.values, "NW": geo.units}
        for per_program in (4096, 16384, 65536):
            block = per_program // geo.values
            grid = (triton.cdiv(n_groups, block),)
            for warps in (4, 8, 16):
                def unpack(k=unpack_kernel, g=grid, b=block, w=warps, src=src_unpack, m=meta, n=n_groups):
                    out = torch.empty(n * m["NV"], dtype=torch.uint8, device=src.device)
                    k[g](src, out, n, BLOCK=b, num_warps=w, **m)
                    return out

                def pack(k=pack_kernel, g=grid, b=block, w=warps, m=meta, n=n_groups, lay=layout, units=geo.units):
                    dt = torch.uint8 if lay == "byte" else torch.int32
                    out = torch.empty(n * units, dtype=dt, device=values.device)
                    k[g](values, out, n, BLOCK=b, num_warps=w, **m)
                    return out

                yield f"triton-{layout}-unpack v{per_program} w{warps}", "unpack", unpack
                yield f"triton-{layout}-pack v{per_program} w{warps}", "pack", pack


def cuda_variants(packed: torch.Tensor):
    from kvbits.cuda import load_extension
    from kvbits.cuda.loader import source_path

    ext = load_extension("pack3_sweep_experiment", functions=["unpack3_sweep"],
                         declarations="torch::Tensor unpack3_sweep(torch::Tensor packed, int64_t quads, "
                                      "int64_t blocks, int64_t threads);",
                         source_text=source_path("pack3").read_text() + EXPERIMENT_CU)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    yield "cuda library unpack", "unpack", lambda: unpack_bits(packed, 3, backend="cuda")
    yield "cuda library pack", "pack", None
    for quads in (4, 8):
        for threads in (128, 256):
            for waves in (4, 8, 16):
                blocks = sms * waves
                yield (f"cuda-experiment unpack q{quads} t{threads} b{waves}xSM", "unpack",
                       lambda q=quads, t=threads, b=blocks: ext.unpack3_sweep(packed, q, b, t))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "reports" / "packing"))
    parser.add_argument("--gib", type=float, default=1.0, help="packed stream size in GiB")
    args = parser.parse_args()
    torch.manual_seed(0)
    n_bytes = int(args.gib * 2**30) // 96 * 96  # whole units of 8 quads
    values = torch.randint(0, 8, (n_bytes // 3 * 8,), dtype=torch.uint8, device="cuda")
    packed = pack_bits(values, 3, backend="cuda", validate=False)
    assert torch.equal(packed[: 3 << 20], pack_bits(values[: 8 << 20], 3, backend="torch"))
    copy, write = copy_bandwidth_gbps(), write_bandwidth_gbps()
    moved = packed.numel() + values.numel()
    rows = []
    variants = list(triton_variants(packed, values)) + list(cuda_variants(packed))
    for name, direction, fn in variants:
        if fn is None:
            fn = lambda: pack_bits(values, 3, backend="cuda", validate=False)  # noqa: E731
        out = fn()
        expected = values if direction == "unpack" else (packed if "word" not in name else packed.view(torch.int32))
        ok = bool(torch.equal(out.view(-1), expected.view(-1)))
        del out
        figures = bandwidth_metrics(moved, median_ms(fn)) if ok else {}  # a wrong variant is not timed
        ms = figures.get("ms")
        rows.append({"variant": name, "direction": direction, "correct": ok, "ms": ms, "gbps": figures.get("gbps"),
                     "pct_of_copy": figures.get("pct_of_peak")})
        timing = f"{ms:8.3f} ms {rows[-1]['pct_of_copy']:6.1f}% of copy" if ok else "not timed"
        print(f"{name:<44} {'ok' if ok else 'WRONG':<5} {timing}", flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "packing_sweep.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(0), "copy_gbps": copy, "write_only_gbps": write,
         "packed_bytes": packed.numel(), "rows": rows}, indent=2) + "\n")
    print(f"\ncopy {copy:,.0f} GB/s, write-only {write:,.0f} GB/s; best per direction:")
    for direction in ("unpack", "pack"):
        best = sorted((r for r in rows if r["direction"] == direction and r["correct"]), key=lambda r: r["ms"])[:5]
        for r in best:
            print(f"  {direction:<7} {r['variant']:<44} {r['ms']:.3f} ms  {r['pct_of_copy']:.1f}% of copy")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
