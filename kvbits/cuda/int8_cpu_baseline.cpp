// CPU baseline for INT8 per-channel symmetric quantization: the "cpu_baseline" variant of
// kvbits/int8.py, shaped as the CPU code of *GPU-Accelerated KV Cache Quantization*
// (docs/design.md section 1; its quant_cpu.c).
//
// x: float32 [T, D] row-major, contiguous.  scales: float32 [D].  q: int8 [T, D].  out: float32 [T, D].
//
//   int8_cpu_compute_scales  OpenMP over columns: each thread scans whole columns (strided reads),
//                            as that work's compute_scales() does.
//   int8_cpu_quantize        one serial loop over every element (that work's quantize_matrix()).
//   int8_cpu_dequantize      one serial loop over every element (that work's dequantize_matrix()).
//
// The arithmetic is the contract of kvbits/int8.py, kept bit for bit by every variant:
//   amax_d = max_t |x[t, d]|, compared by the IEEE bit pattern of |x| (so NaN and Inf dominate)
//   s_d    = 0 if amax_d < 2^-64 else amax_d / 127          (IEEE division, round to nearest)
//   inv_d  = 0 if s_d == 0 else 1 / s_d                     (IEEE division, round to nearest)
//   q      = round_half_even(clamp(x * inv_d, -128, 127))   (one IEEE multiply)
//   x_hat  = float(q) * s_d                                 (one IEEE multiply)
// Build with -ffp-contract=off and without -ffast-math so that nothing is fused or reassociated.
//
// Tested bit for bit against a float64 oracle of this arithmetic (suites/int8_support.py: oracle)
// and against the torch variant, in suites/test_int8_basics.py, test_int8_core.py and
// test_int8_variants.py; it is the baseline of the speedups in test_bench_int8.py.

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr float kTinyAmax = 0x1p-64f;

inline uint32_t abs_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits & 0x7fffffffu;
}

inline float bits_to_float(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

inline float scale_from_amax(float amax) { return amax < kTinyAmax ? 0.0f : amax / 127.0f; }

inline float inverse_scale(float s) { return s == 0.0f ? 0.0f : 1.0f / s; }

inline int8_t quantize_one(float v, float inv) {
  float y = v * inv;
  y = std::fmin(std::fmax(y, -128.0f), 127.0f);
  return static_cast<int8_t>(std::nearbyint(y));  // default rounding mode: half to even
}

void require_cpu(const at::Tensor& t, const char* name, at::ScalarType type) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == type, name, " has the wrong dtype");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

}  // namespace

void int8_cpu_compute_scales(at::Tensor x, at::Tensor scales) {
  require_cpu(x, "x", at::kFloat);
  require_cpu(scales, "scales", at::kFloat);
  TORCH_CHECK(x.dim() == 2 && scales.numel() == x.size(1), "x must be [T, D] and scales [D]");
  const int64_t T = x.size(0), D = x.size(1);
  const float* xp = x.data_ptr<float>();
  float* sp = scales.data_ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t d = 0; d < D; ++d) {
    uint32_t best = 0;
    for (int64_t t = 0; t < T; ++t) {
      const uint32_t bits = abs_bits(xp[t * D + d]);
      if (bits > best) best = bits;
    }
    sp[d] = scale_from_amax(bits_to_float(best));
  }
}

void int8_cpu_quantize(at::Tensor x, at::Tensor scales, at::Tensor q) {
  require_cpu(x, "x", at::kFloat);
  require_cpu(scales, "scales", at::kFloat);
  require_cpu(q, "q", at::kChar);
  TORCH_CHECK(x.dim() == 2 && scales.numel() == x.size(1) && q.sizes() == x.sizes(),
              "x must be [T, D], scales [D] and q [T, D]");
  const int64_t T = x.size(0), D = x.size(1);
  const float* xp = x.data_ptr<float>();
  const float* sp = scales.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  std::fesetround(FE_TONEAREST);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < D; ++d) {
      qp[t * D + d] = quantize_one(xp[t * D + d], inverse_scale(sp[d]));
    }
  }
}

void int8_cpu_dequantize(at::Tensor q, at::Tensor scales, at::Tensor out) {
  require_cpu(q, "q", at::kChar);
  require_cpu(scales, "scales", at::kFloat);
  require_cpu(out, "out", at::kFloat);
  TORCH_CHECK(q.dim() == 2 && scales.numel() == q.size(1) && out.sizes() == q.sizes(),
              "q must be [T, D], scales [D] and out [T, D]");
  const int64_t T = q.size(0), D = q.size(1);
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < D; ++d) {
      op[t * D + d] = static_cast<float>(qp[t * D + d]) * sp[d];
    }
  }
}
