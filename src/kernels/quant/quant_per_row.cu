// CUDA per-row (per-output-channel / per-token) INT8 quantizer
// (quant_common.h, format 2, one scale per row).
//
// Design: one CTA per row, of 32..256 threads (a multiple of 32, enough for
// 4 packs per thread: 64 threads for 1536 columns, 160 for 5120, so an SM
// keeps up to 32 rows in flight). Pass 1 reads the row in 8-element packs
// (pack p to thread p % threads, 4 loads in flight per thread) and reduces the
// amax (shuffles + one shared-memory exchange); pass 2 reads the row again
// and writes the codes. A row is a few to a few tens of KB and the CTAs on an
// SM hold a few rows at once, so the second read hits L1 (global loads are
// L1-cached on sm_80+): HBM sees one read and one write. Any cols: rows that
// are not 8-aligned take the element-wise path.
//
// Traffic per element: 2 bytes read (bf16) + 1 written.
// Predicted (bytes / 4.0 TB/s), bf16:
//   32760 x 1536: 151.0 MB -> 37.7 us;  75600 x 5120: 1161.2 MB -> 290 us.
#include "kernels/quant/quant_device.cuh"
#include "kernels/quant/quant_per_row.h"

namespace td::kernels {
namespace {

using namespace qdev;

constexpr int kMaxThreads = 256;

template <typename T, bool kVec>
__device__ __forceinline__ Pack8<T> load_row_pack(const T* row, int64_t col, int64_t cols) {
  const int64_t left = cols - col;
  if (left <= 0) return zero_pack<T>();
  if (kVec) return load_pack(row + col);
  return load_pack_partial(row + col, int(left > 8 ? 8 : left));
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kMaxThreads)
    quantize_per_row_kernel(const T* __restrict__ x, int64_t cols, int64_t ld_x, int8_t* __restrict__ q, int64_t ld_q,
                            float* __restrict__ scales) {
  __shared__ float warp_amax[kMaxThreads / 32];
  const int64_t nt = blockDim.x;
  const int64_t r = blockIdx.x;
  const T* row = x + r * ld_x;
  const int64_t packs = (cols + 7) / 8;
  constexpr int kUnroll = 4;

  uint32_t amax_bits = 0;
  for (int64_t p0 = threadIdx.x; p0 < packs; p0 += nt * kUnroll) {
    Pack8<T> raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) raw[u] = load_row_pack<T, kVec>(row, (p0 + u * nt) * 8, cols);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) amax_bits = absmax_bits(raw[u], amax_bits);
  }
  float amax = group_max<32>(amax_from_bits<T>(amax_bits));
  if ((threadIdx.x & 31u) == 0) warp_amax[threadIdx.x >> 5] = amax;
  __syncthreads();
  for (int w = 0; w < int(nt / 32); ++w) amax = fmaxf(amax, warp_amax[w]);
  const QuantParams p = symmetric_params_dev(amax);

  for (int64_t p0 = threadIdx.x; p0 < packs; p0 += nt * kUnroll) {
    Pack8<T> raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) raw[u] = load_row_pack<T, kVec>(row, (p0 + u * nt) * 8, cols);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t col = (p0 + u * nt) * 8;
      if (col < cols) {
        float f[8];
        unpack(raw[u], f);
        const int64_t left = cols - col;
        store_codes(q + r * ld_q + col, quantize8(f, p.inv), int(left > 8 ? 8 : left), kVec);
      }
    }
  }
  if (threadIdx.x == 0) scales[r] = p.scale;
}

}  // namespace

Status quantize_per_row_cuda(ElemType x_type, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* q,
                             int64_t ld_q, float* scales, void* stream) {
  if (rows < 0 || cols < 0) return Status::InvalidArgument;
  if (rows == 0 || cols == 0) return Status::Ok;
  if (!x || !q || !scales || ld_x < cols || ld_q < cols || rows > 0x7fffffff) return Status::InvalidArgument;
  const bool vec = cols % 8 == 0 && ld_x % 8 == 0 && ld_q % 8 == 0 && aligned_to(x, 16) && aligned_to(q, 8);
  const int64_t packs = (cols + 7) / 8;
  const int64_t want = ((packs + 3) / 4 + 31) / 32 * 32;
  const unsigned threads = unsigned(want < kMaxThreads ? want : kMaxThreads);
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_act_type(x_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (vec)
      quantize_per_row_kernel<T, true>
          <<<unsigned(rows), threads, 0, s>>>(static_cast<const T*>(x), cols, ld_x, q, ld_q, scales);
    else
      quantize_per_row_kernel<T, false>
          <<<unsigned(rows), threads, 0, s>>>(static_cast<const T*>(x), cols, ld_x, q, ld_q, scales);
    return launch_status();
  });
}

}  // namespace td::kernels
