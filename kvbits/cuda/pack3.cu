// 3-bit pack / unpack in the canonical LSB-first stream (docs/design.md section 3): the
// "cuda" backend of kvbits.packing for b = 3.
//
// Computes: value i of a row holds bits [3i, 3i + 3) of a little-endian stream; per octet
//   b0 = v0 | v1 << 3 | (v2 & 3) << 6,  b1 = v2 >> 2 | v3 << 1 | v4 << 4 | (v5 & 1) << 7,
//   b2 = v5 >> 1 | v6 << 2 | v7 << 5,  and the inverse.
//
// The byte layout (3 bytes per 8 values) and the int32 word layout (3 words per
// 32 values) are the same bytes, so one pair of kernels serves both:
//   * a thread handles a "quad" of 4 octets = 12 bytes = 3 little-endian words =
//     32 values, with 32-bit loads of the packed side and 16-byte accesses of the
//     value side, lanes unpacked with compile-time shifts (lanes 10 and 21 join
//     two words: lo | hi);
//   * the octets past the last whole quad, and buffers not aligned for wide
//     accesses, take the per-octet path (the b0/b1/b2 formulas above, as one 24-bit word).
//
// values: uint8 [n_octets * 8], each < 8;  packed: uint8 [n_octets * 3] (contiguous, CUDA;
// the int32 word view is the same bytes).
//
// Tested against the torch reference and the per-octet formulas (suites/test_golden.py), in
// suites/test_bijection.py (all 2^24 octet states, both inverses), test_walking.py,
// test_golden.py, test_gptq.py and test_bad_input_packing.py (backend "cuda" on a GPU); speed in
// test_bench_packing.py.

#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void unpack_octet(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst) {
    const uint32_t word24 = uint32_t(src[0]) | (uint32_t(src[1]) << 8) | (uint32_t(src[2]) << 16);
#pragma unroll
    for (int lane = 0; lane < 8; ++lane) dst[lane] = (word24 >> (3 * lane)) & 0x7u;
}

__device__ __forceinline__ void pack_octet(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst) {
    uint32_t word24 = 0;
#pragma unroll
    for (int lane = 0; lane < 8; ++lane) word24 |= uint32_t(src[lane] & 0x7u) << (3 * lane);
    dst[0] = word24 & 0xFFu;
    dst[1] = (word24 >> 8) & 0xFFu;
    dst[2] = (word24 >> 16) & 0xFFu;
}

// Lane i of a 96-bit group: word i*3/32, shift i*3%32; straddles when the shift > 29.
template <int I>
__device__ __forceinline__ uint32_t lane_of(uint32_t w0, uint32_t w1, uint32_t w2) {
    constexpr int kWord = (3 * I) / 32;
    constexpr int kShift = (3 * I) % 32;
    const uint32_t lo_word = kWord == 0 ? w0 : (kWord == 1 ? w1 : w2);
    const uint32_t hi_word = kWord == 0 ? w1 : w2;
    uint32_t v = lo_word >> kShift;
    if (kShift > 29) v |= hi_word << (32 - kShift);
    return v & 0x7u;
}

template <int I>
__device__ __forceinline__ void unpack_lanes(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t (&out)[8]) {
    if constexpr (I < 32) {
        out[I / 4] |= lane_of<I>(w0, w1, w2) << (8 * (I % 4));
        unpack_lanes<I + 1>(w0, w1, w2, out);
    }
}

template <int I>
__device__ __forceinline__ void pack_lanes(const uint32_t (&in)[8], uint32_t& w0, uint32_t& w1, uint32_t& w2) {
    if constexpr (I < 32) {
        constexpr int kWord = (3 * I) / 32;
        constexpr int kShift = (3 * I) % 32;
        const uint32_t v = (in[I / 4] >> (8 * (I % 4))) & 0x7u;
        uint32_t& lo = kWord == 0 ? w0 : (kWord == 1 ? w1 : w2);
        lo |= v << kShift;
        if constexpr (kShift > 29) {
            uint32_t& hi = kWord == 0 ? w1 : w2;
            hi |= v >> (32 - kShift);
        }
        pack_lanes<I + 1>(in, w0, w1, w2);
    }
}

__global__ void unpack3_kernel(const uint8_t* __restrict__ packed, uint8_t* __restrict__ values,
                               int64_t n_octets, bool wide) {
    const int64_t n_quads = wide ? n_octets / 4 : 0;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint32_t* words = reinterpret_cast<const uint32_t*>(packed);
    uint4* out = reinterpret_cast<uint4*>(values);
    for (int64_t q = first; q < n_quads; q += stride) {
        const uint32_t w0 = __ldg(words + 3 * q), w1 = __ldg(words + 3 * q + 1), w2 = __ldg(words + 3 * q + 2);
        uint32_t lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        unpack_lanes<0>(w0, w1, w2, lanes);
        out[2 * q] = make_uint4(lanes[0], lanes[1], lanes[2], lanes[3]);
        out[2 * q + 1] = make_uint4(lanes[4], lanes[5], lanes[6], lanes[7]);
    }
    for (int64_t o = 4 * n_quads + first; o < n_octets; o += stride) unpack_octet(packed + 3 * o, values + 8 * o);
}

__global__ void pack3_kernel(const uint8_t* __restrict__ values, uint8_t* __restrict__ packed,
                             int64_t n_octets, bool wide) {
    const int64_t n_quads = wide ? n_octets / 4 : 0;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint4* in = reinterpret_cast<const uint4*>(values);
    uint32_t* words = reinterpret_cast<uint32_t*>(packed);
    for (int64_t q = first; q < n_quads; q += stride) {
        const uint4 a = __ldg(in + 2 * q), b = __ldg(in + 2 * q + 1);
        const uint32_t lanes[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        uint32_t w0 = 0, w1 = 0, w2 = 0;
        pack_lanes<0>(lanes, w0, w1, w2);
        words[3 * q] = w0;
        words[3 * q + 1] = w1;
        words[3 * q + 2] = w2;
    }
    for (int64_t o = 4 * n_quads + first; o < n_octets; o += stride) pack_octet(values + 8 * o, packed + 3 * o);
}

int blocks_for(int64_t work) {
    int device = 0, sms = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int64_t wanted = (work + kThreads - 1) / kThreads;
    return int(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(sms) * 16)));
}

void check_flat_u8(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t.scalar_type() == torch::kUInt8, name, " must be uint8");
    TORCH_CHECK(t.dim() == 1 && t.is_contiguous(), name, " must be a contiguous 1-d tensor");
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

torch::Tensor unpack3_cuda(torch::Tensor packed) {
    check_flat_u8(packed, "packed");
    TORCH_CHECK(packed.numel() % 3 == 0, "packed must hold whole 3-byte octets");
    const c10::cuda::CUDAGuard guard(packed.device());
    const int64_t n_octets = packed.numel() / 3;
    auto values = torch::empty({n_octets * 8}, packed.options());
    if (n_octets == 0) return values;
    const bool wide = aligned(packed.data_ptr(), 4) && aligned(values.data_ptr(), 16);
    unpack3_kernel<<<blocks_for(wide ? n_octets / 4 + 4 : n_octets), kThreads, 0,
                     at::cuda::getCurrentCUDAStream()>>>(packed.data_ptr<uint8_t>(), values.data_ptr<uint8_t>(),
                                                         n_octets, wide);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return values;
}

torch::Tensor pack3_cuda(torch::Tensor values) {
    check_flat_u8(values, "values");
    TORCH_CHECK(values.numel() % 8 == 0, "values must hold whole octets of 8");
    const c10::cuda::CUDAGuard guard(values.device());
    const int64_t n_octets = values.numel() / 8;
    auto packed = torch::empty({n_octets * 3}, values.options());
    if (n_octets == 0) return packed;
    const bool wide = aligned(values.data_ptr(), 16) && aligned(packed.data_ptr(), 4);
    pack3_kernel<<<blocks_for(wide ? n_octets / 4 + 4 : n_octets), kThreads, 0,
                   at::cuda::getCurrentCUDAStream()>>>(values.data_ptr<uint8_t>(), packed.data_ptr<uint8_t>(),
                                                       n_octets, wide);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return packed;
}
