// INT8 per-channel symmetric quantization on the GPU: one scales pass and four kernel variants
// (naive, tiled, coarsened, vectorized: those of *GPU-Accelerated KV Cache Quantization*,
// docs/design.md section 1), the CUDA variants of kvbits/int8.py.
//
// Shapes: x [T, D] (float32, float16 or bfloat16, row-major, contiguous), scales and inv [D]
// float32, q [T, D] int8, out [T, D] float32. Every pointer is 16-byte aligned for "vectorized"
// (the Python wrapper guarantees it).
//
// Arithmetic (kvbits/int8.py states it once; every variant keeps it bit for bit):
//   amax_d = max_t |x[t, d]| compared by the IEEE bit pattern of |x| (NaN and Inf dominate)
//   s_d    = 0 if amax_d < 2^-64 else amax_d / 127      (__fdiv_rn: IEEE even under fast math)
//   inv_d  = 0 if s_d == 0 else 1 / s_d                 (__fdiv_rn)
//   q      = round_half_even(clamp(x * inv_d, -128, 127))
//   x_hat  = float(q) * s_d
// With the 2^-64 floor every scale, inverse and nonzero product is a normal float or rounds to
// code 0, so flushing denormals (fast math) cannot change a code or a reconstruction.
//
// Host entry points (bound by kvbits/int8.py through kvbits/cuda/loader.py). The caller makes
// the tensors' device current and passes its current stream (torch.cuda.current_stream().cuda_stream),
// so this file needs only ATen and the CUDA runtime headers:
//   int8_cuda_scales(x, scales, inv, stream)               scales pass + finalize (shared by all variants)
//   int8_cuda_quantize(x, inv, q, variant, stream)         variant 0 naive, 1 tiled, 2 coarsened, 3 vectorized
//   int8_cuda_dequantize(q, scales, out, variant, stream)  same variant codes
//
// Scales pass: blocks of (BX, BY) threads; each thread owns 4 adjacent columns (one 16-byte load
// per row when D % 4 == 0, else one column) and strides over rows; the block reduces over its rows
// in shared memory, then one atomicMax per column on the float bits (non-negative floats order like
// their unsigned bit patterns), written into the scales buffer itself; a finalize kernel turns the
// bits into s and 1/s.
//
// Tested bit for bit (codes, scales, reconstructions) against a float64 oracle of the arithmetic
// above (suites/int8_support.py: oracle) and against the naive variant, in suites/test_int8_basics.py,
// test_int8_core.py, test_int8_variants.py and test_int8_bad_input.py; speed in test_bench_int8.py.

#include <ATen/ATen.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace int8q {

constexpr float kTinyAmax = 0x1p-64f;
constexpr int kThreads = 256;

// ---------------------------------------------------------------- element conversions
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(int8_t v) { return static_cast<float>(v); }

// Four adjacent elements moved with one vector access (float4 / char4 for float32 and int8).
template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

template <typename T>
__device__ __forceinline__ Pack4<T> load4(const T* p) {
  return *reinterpret_cast<const Pack4<T>*>(p);
}
template <>
__device__ __forceinline__ Pack4<float> load4<float>(const float* p) {
  const float4 f = *reinterpret_cast<const float4*>(p);
  return {{f.x, f.y, f.z, f.w}};
}
template <>
__device__ __forceinline__ Pack4<int8_t> load4<int8_t>(const int8_t* p) {
  const char4 c = *reinterpret_cast<const char4*>(p);
  return {{static_cast<int8_t>(c.x), static_cast<int8_t>(c.y), static_cast<int8_t>(c.z),
           static_cast<int8_t>(c.w)}};
}

__device__ __forceinline__ void store4(float* p, const Pack4<float>& v) {
  __stcs(reinterpret_cast<float4*>(p), make_float4(v.v[0], v.v[1], v.v[2], v.v[3]));
}
__device__ __forceinline__ void store4(int8_t* p, const Pack4<int8_t>& v) {
  *reinterpret_cast<char4*>(p) = make_char4(v.v[0], v.v[1], v.v[2], v.v[3]);
}

// ---------------------------------------------------------------- the two element operations
struct QuantizeOp {  // param = inv_d
  using Out = int8_t;
  __device__ __forceinline__ static int8_t apply(float v, float inv) {
    const float y = fminf(fmaxf(v * inv, -128.0f), 127.0f);
    return static_cast<int8_t>(__float2int_rn(y));  // round half to even
  }
};

struct DequantizeOp {  // param = s_d
  using Out = float;
  __device__ __forceinline__ static float apply(float q, float s) { return q * s; }
};

// ---------------------------------------------------------------- scales pass
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

template <typename T, bool kVec>
__global__ void absmax_kernel(const T* __restrict__ x, unsigned* __restrict__ amax_bits, int64_t T_,
                              int64_t D) {
  constexpr int kCols = kVec ? 4 : 1;
  extern __shared__ unsigned partial[];  // [BY][BX * kCols]
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * bx + tx) * kCols;
  unsigned best[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) best[c] = 0u;
  if (col < D) {
    const int64_t step = static_cast<int64_t>(gridDim.y) * by;
    int64_t t = static_cast<int64_t>(blockIdx.y) * by + ty;
    if constexpr (kVec) {
      for (; t + 3 * step < T_; t += 4 * step) {  // four rows in flight per thread
        Pack4<T> v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = load4(x + (t + u * step) * D + col);
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int c = 0; c < 4; ++c) best[c] = max(best[c], abs_bits(to_f32(v[u].v[c])));
      }
      for (; t < T_; t += step) {
        const Pack4<T> v = load4(x + t * D + col);
#pragma unroll
        for (int c = 0; c < 4; ++c) best[c] = max(best[c], abs_bits(to_f32(v.v[c])));
      }
    } else {
      for (; t < T_; t += step) best[0] = max(best[0], abs_bits(to_f32(x[t * D + col])));
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) partial[(ty * bx + tx) * kCols + c] = best[c];
  __syncthreads();
  if (ty == 0 && col < D) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      unsigned m = best[c];
      for (int r = 1; r < by; ++r) m = max(m, partial[(r * bx + tx) * kCols + c]);
      if (m != 0u && col + c < D) atomicMax(amax_bits + col + c, m);
    }
  }
}

__global__ void finalize_scales_kernel(float* __restrict__ scales, float* __restrict__ inv, int64_t D) {
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= D) return;
  const float amax = __uint_as_float(reinterpret_cast<const unsigned*>(scales)[d]);
  const float s = amax < kTinyAmax ? 0.0f : __fdiv_rn(amax, 127.0f);
  scales[d] = s;
  inv[d] = s == 0.0f ? 0.0f : __fdiv_rn(1.0f, s);
}

// ---------------------------------------------------------------- variant 0: naive
// One thread per element of the flattened matrix; column = index % D.
template <class Op, typename In>
__global__ void naive_kernel(const In* __restrict__ in, typename Op::Out* __restrict__ out,
                             const float* __restrict__ param, int64_t n, int64_t D) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = Op::apply(to_f32(in[i]), param[i % D]);
}

// ---------------------------------------------------------------- variant 1: tiled
// A 32 x 32 tile is staged in shared memory (as float, padded against bank conflicts) with its 32
// parameters, then transformed from shared memory; blocks stride over row tiles.
constexpr int kTile = 32;
constexpr int kTileRows = 8;

template <class Op, typename In>
__global__ void tiled_kernel(const In* __restrict__ in, typename Op::Out* __restrict__ out,
                             const float* __restrict__ param, int64_t T_, int64_t D) {
  __shared__ float tile[kTile][kTile + 1];
  __shared__ float p[kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  if (ty == 0) p[tx] = col < D ? param[col] : 0.0f;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile; r0 < T_; r0 += static_cast<int64_t>(gridDim.y) * kTile) {
    for (int r = ty; r < kTile; r += kTileRows) {
      const int64_t row = r0 + r;
      if (row < T_ && col < D) tile[r][tx] = to_f32(in[row * D + col]);
    }
    __syncthreads();
    for (int r = ty; r < kTile; r += kTileRows) {
      const int64_t row = r0 + r;
      if (row < T_ && col < D) out[row * D + col] = Op::apply(tile[r][tx], p[tx]);
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------- variant 2: thread-coarsened
// Each thread handles kCoarsen elements spaced blockDim.x apart (coalesced), grid-stride.
constexpr int kCoarsen = 8;

template <class Op, typename In>
__global__ void coarsened_kernel(const In* __restrict__ in, typename Op::Out* __restrict__ out,
                                 const float* __restrict__ param, int64_t n, int64_t D) {
  const int64_t span = static_cast<int64_t>(blockDim.x) * kCoarsen;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * span + threadIdx.x; base < n;
       base += static_cast<int64_t>(gridDim.x) * span) {
#pragma unroll
    for (int j = 0; j < kCoarsen; ++j) {
      const int64_t i = base + static_cast<int64_t>(j) * blockDim.x;
      if (i < n) out[i] = Op::apply(to_f32(in[i]), param[i % D]);
    }
  }
}

// ---------------------------------------------------------------- variant 3: vectorized
// Needs D % 4 == 0. Thread g owns element groups g, g + S, g + 2S, ... of 4 elements (S = total
// threads). The host picks the grid so that 4*S is a multiple of D (or S covers every group), so a
// thread's 4 columns never change: its 4 parameters are loaded once, and each step is one 16-byte
// float4 access and one 4-byte char4 access, four groups in flight per thread.
template <class Op, typename In>
__global__ void vectorized_kernel(const In* __restrict__ in, typename Op::Out* __restrict__ out,
                                  const float* __restrict__ param, int64_t groups, int64_t D) {
  using Out = typename Op::Out;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const Pack4<float> p = load4(param + (g * 4) % D);
  auto transform = [&p](const Pack4<In>& v) {
    Pack4<Out> r;
#pragma unroll
    for (int c = 0; c < 4; ++c) r.v[c] = Op::apply(to_f32(v.v[c]), p.v[c]);
    return r;
  };
  for (; g + 3 * stride < groups; g += 4 * stride) {
    Pack4<In> v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = load4(in + (g + u * stride) * 4);
#pragma unroll
    for (int u = 0; u < 4; ++u) store4(out + (g + u * stride) * 4, transform(v[u]));
  }
  for (; g < groups; g += stride) store4(out + g * 4, transform(load4(in + g * 4)));
}

// ---------------------------------------------------------------- launch configuration
void check_cuda(cudaError_t status) { TORCH_CHECK(status == cudaSuccess, "CUDA error: ", cudaGetErrorString(status)); }

int sm_count() {
  int device = 0, count = 0;
  check_cuda(cudaGetDevice(&device));
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    const int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for the vectorized kernel: enough to fill the device, a multiple of D/4 / gcd(D/4, 256)
// so that the grid stride is a whole number of rows, and never more than the work needs.
int64_t vectorized_blocks(int64_t groups, int64_t D) {
  const int64_t needed = ceil_div(groups, kThreads);
  const int64_t granule = (D / 4) / gcd64(D / 4, kThreads);
  const int64_t target = ceil_div(static_cast<int64_t>(sm_count()) * 8, granule) * granule;
  return needed <= target ? needed : target;
}

template <class Op, typename In>
void launch_variant(int64_t variant, const In* in, typename Op::Out* out, const float* param, int64_t T_,
                    int64_t D, cudaStream_t stream) {
  const int64_t n = T_ * D;
  switch (variant) {
    case 0:
      naive_kernel<Op, In><<<static_cast<unsigned>(ceil_div(n, kThreads)), kThreads, 0, stream>>>(in, out, param, n, D);
      break;
    case 1: {
      const dim3 grid(static_cast<unsigned>(ceil_div(D, kTile)),
                      static_cast<unsigned>(std::min<int64_t>(ceil_div(T_, kTile), 65535)));
      tiled_kernel<Op, In><<<grid, dim3(kTile, kTileRows), 0, stream>>>(in, out, param, T_, D);
      break;
    }
    case 2: {
      const int64_t blocks = std::min<int64_t>(ceil_div(n, kThreads * kCoarsen), int64_t(sm_count()) * 32);
      coarsened_kernel<Op, In><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(in, out, param, n, D);
      break;
    }
    case 3: {
      TORCH_CHECK(D % 4 == 0, "variant 'vectorized' needs D % 4 == 0; got D = ", D);
      const int64_t groups = n / 4;
      vectorized_kernel<Op, In><<<static_cast<unsigned>(vectorized_blocks(groups, D)), kThreads, 0, stream>>>(in, out, param, groups, D);
      break;
    }
    default:
      TORCH_CHECK(false, "unknown CUDA variant code ", variant);
  }
  check_cuda(cudaGetLastError());
}

template <typename T>
void launch_scales(const T* x, float* scales, float* inv, int64_t T_, int64_t D, bool vec, cudaStream_t stream) {
  const int64_t cols_per_thread = vec ? 4 : 1;
  const int64_t lanes = ceil_div(D, cols_per_thread);
  int bx = 1;
  while (bx < lanes && bx < (vec ? 64 : 128)) bx *= 2;
  const int by = kThreads / bx;
  const int64_t col_blocks = ceil_div(lanes, bx);
  const int64_t row_blocks = std::max<int64_t>(
      1, std::min<int64_t>(ceil_div(T_, by), ceil_div(int64_t(sm_count()) * 8, col_blocks)));
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(std::min<int64_t>(row_blocks, 65535)));
  const size_t shared = sizeof(unsigned) * kThreads * cols_per_thread;
  auto* bits = reinterpret_cast<unsigned*>(scales);
  check_cuda(cudaMemsetAsync(bits, 0, sizeof(unsigned) * D, stream));
  if (vec) {
    absmax_kernel<T, true><<<grid, dim3(bx, by), shared, stream>>>(x, bits, T_, D);
  } else {
    absmax_kernel<T, false><<<grid, dim3(bx, by), shared, stream>>>(x, bits, T_, D);
  }
  check_cuda(cudaGetLastError());
  finalize_scales_kernel<<<static_cast<unsigned>(ceil_div(D, kThreads)), kThreads, 0, stream>>>(scales, inv, D);
  check_cuda(cudaGetLastError());
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_matrix(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), name, " must be a contiguous [T, D] tensor");
}

void check_vector(const at::Tensor& t, const char* name, int64_t D) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == D,
              name, " must be a contiguous float32 CUDA tensor of D elements");
}

}  // namespace int8q

// ---------------------------------------------------------------- host entry points
void int8_cuda_scales(at::Tensor x, at::Tensor scales, at::Tensor inv, int64_t stream_handle) {
  using namespace int8q;
  check_matrix(x, "x");
  const int64_t T_ = x.size(0), D = x.size(1);
  check_vector(scales, "scales", D);
  check_vector(inv, "inv", D);
  const cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_handle);
  float* s = scales.data_ptr<float>();
  float* i = inv.data_ptr<float>();
  const bool vec = D % 4 == 0 && aligned16(x.data_ptr());
  switch (x.scalar_type()) {
    case at::kFloat:
      launch_scales(x.data_ptr<float>(), s, i, T_, D, vec, stream);
      break;
    case at::kHalf:
      launch_scales(reinterpret_cast<const __half*>(x.data_ptr<at::Half>()), s, i, T_, D, vec, stream);
      break;
    case at::kBFloat16:
      launch_scales(reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>()), s, i, T_, D, vec, stream);
      break;
    default:
      TORCH_CHECK(false, "x must be float32, float16 or bfloat16");
  }
}

void int8_cuda_quantize(at::Tensor x, at::Tensor inv, at::Tensor q, int64_t variant, int64_t stream_handle) {
  using namespace int8q;
  check_matrix(x, "x");
  check_matrix(q, "q");
  const int64_t T_ = x.size(0), D = x.size(1);
  check_vector(inv, "inv", D);
  TORCH_CHECK(q.scalar_type() == at::kChar && q.sizes() == x.sizes(), "q must be int8 with the shape of x");
  TORCH_CHECK(variant != 3 || (aligned16(x.data_ptr()) && aligned16(inv.data_ptr()) && aligned16(q.data_ptr())),
              "variant 'vectorized' needs 16-byte aligned tensors");
  const cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_handle);
  const float* p = inv.data_ptr<float>();
  int8_t* out = q.data_ptr<int8_t>();
  switch (x.scalar_type()) {
    case at::kFloat:
      launch_variant<QuantizeOp>(variant, x.data_ptr<float>(), out, p, T_, D, stream);
      break;
    case at::kHalf:
      launch_variant<QuantizeOp>(variant, reinterpret_cast<const __half*>(x.data_ptr<at::Half>()), out, p, T_, D,
                                 stream);
      break;
    case at::kBFloat16:
      launch_variant<QuantizeOp>(variant, reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>()), out,
                                 p, T_, D, stream);
      break;
    default:
      TORCH_CHECK(false, "x must be float32, float16 or bfloat16");
  }
}

void int8_cuda_dequantize(at::Tensor q, at::Tensor scales, at::Tensor out, int64_t variant, int64_t stream_handle) {
  using namespace int8q;
  check_matrix(q, "q");
  check_matrix(out, "out");
  const int64_t T_ = q.size(0), D = q.size(1);
  check_vector(scales, "scales", D);
  TORCH_CHECK(q.scalar_type() == at::kChar, "q must be int8");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.sizes() == q.sizes(), "out must be float32 with the shape of q");
  TORCH_CHECK(variant != 3 || (aligned16(q.data_ptr()) && aligned16(scales.data_ptr()) && aligned16(out.data_ptr())),
              "variant 'vectorized' needs 16-byte aligned tensors");
  launch_variant<DequantizeOp>(variant, q.data_ptr<int8_t>(), out.data_ptr<float>(), scales.data_ptr<float>(), T_,
                               D, reinterpret_cast<cudaStream_t>(stream_handle));
}
