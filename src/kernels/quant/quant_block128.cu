// CUDA 128x128 block INT8 quantizer (TurboDiffusion's format, quant_common.h).
//
// Design: one CTA of 256 threads per 128x128 block (grid: column blocks in x,
// so the CTAs running together cover whole 128-row stripes of x, row blocks
// in y). Thread t owns columns [8*(t%16), +8) of rows t/16 + 16*i, i < 8: 8
// packs of 8 elements, one 16-byte load each for bf16/fp16 (a warp reads two
// 256-byte row segments per instruction), all issued before any arithmetic.
// The block holds its 16384 elements in registers (32 registers of raw bf16
// per thread; 4 CTAs per SM keep 128 KB of loads in flight), so x is read
// once and q written once (8-byte stores). amax: per-thread max on the raw
// bits (no conversions), xor shuffles, one shared-memory exchange across the
// 8 warps. Ragged edges: rows past the end are not loaded, partial packs are
// loaded element by element (zeros do not change an amax).
//
// Traffic per element: 2 bytes read (bf16) + 1 byte written; scales are
// 4 bytes per 16384 elements.
// Predicted (bytes / 4.0 TB/s), bf16:
//   32760 x 1536: 151.0 MB -> 37.7 us;  75600 x 5120: 1161.2 MB -> 290 us.
#include "kernels/quant/quant_block128.h"
#include "kernels/quant/quant_device.cuh"

namespace td::kernels {
namespace {

using namespace qdev;

constexpr int kBlockThreads = 256;
constexpr int kPacksPerThread = kQuantGroup * kQuantGroup / 8 / kBlockThreads;  // 8
constexpr int kRowsPerPass = kBlockThreads / 16;                               // 16

// 4 CTAs (128 KB of bf16 loads in flight) per SM for 16-bit inputs: <= 64 registers.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kBlockThreads, sizeof(T) == 4 ? 2 : 4)
    quantize_block128_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* __restrict__ q,
                             int64_t ld_q, float* __restrict__ scales) {
  __shared__ float warp_amax[kBlockThreads / 32];
  const int tid = int(threadIdx.x);
  const int64_t col = int64_t(blockIdx.x) * kQuantGroup + (tid & 15) * 8;
  const int64_t row0 = int64_t(blockIdx.y) * kQuantGroup + (tid >> 4);
  const int ncols = int(cols - col < 0 ? 0 : (cols - col > 8 ? 8 : cols - col));
  // Pack i is row row0 + 16 i: valid while 16 i < rows_left (and the pack has columns).
  const int64_t rows_left = ncols > 0 ? rows - row0 : 0;
  const T* src = x + row0 * ld_x + col;
  const int64_t src_step = int64_t(kRowsPerPass) * ld_x;

  Pack8<T> raw[kPacksPerThread];
#pragma unroll
  for (int i = 0; i < kPacksPerThread; ++i) {
    if (int64_t(i) * kRowsPerPass < rows_left)
      raw[i] = kVec ? load_pack(src + i * src_step) : load_pack_partial(src + i * src_step, ncols);
    else
      raw[i] = zero_pack<T>();
  }

  uint32_t amax_bits = 0;
#pragma unroll
  for (int i = 0; i < kPacksPerThread; ++i) amax_bits = absmax_bits(raw[i], amax_bits);
  float amax = group_max<32>(amax_from_bits<T>(amax_bits));
  if ((tid & 31) == 0) warp_amax[tid >> 5] = amax;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kBlockThreads / 32; ++w) amax = fmaxf(amax, warp_amax[w]);
  const QuantParams p = block128_params_dev(amax);

  int8_t* dst = q + row0 * ld_q + col;
  const int64_t dst_step = int64_t(kRowsPerPass) * ld_q;
#pragma unroll
  for (int i = 0; i < kPacksPerThread; ++i) {
    if (int64_t(i) * kRowsPerPass < rows_left) {
      float f[8];
      unpack(raw[i], f);
      store_codes(dst + i * dst_step, quantize8(f, p.inv), ncols, kVec);
    }
  }
  if (tid == 0) scales[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = p.scale;
}

}  // namespace

Status quantize_block128_cuda(ElemType x_type, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* q,
                              int64_t ld_q, float* scales, void* stream) {
  if (rows < 0 || cols < 0) return Status::InvalidArgument;
  if (rows == 0 || cols == 0) return Status::Ok;
  if (!x || !q || !scales || ld_x < cols || ld_q < cols) return Status::InvalidArgument;
  const int64_t row_blocks = quant_groups(rows), col_blocks = quant_groups(cols);
  if (row_blocks > 65535 || col_blocks > 0x7fffffff) return Status::InvalidArgument;
  const dim3 grid{unsigned(col_blocks), unsigned(row_blocks), 1u};
  const bool vec = cols % 8 == 0 && ld_x % 8 == 0 && ld_q % 8 == 0 && aligned_to(x, 16) && aligned_to(q, 8);
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_act_type(x_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (vec)
      quantize_block128_kernel<T, true>
          <<<grid, kBlockThreads, 0, s>>>(static_cast<const T*>(x), rows, cols, ld_x, q, ld_q, scales);
    else
      quantize_block128_kernel<T, false>
          <<<grid, kBlockThreads, 0, s>>>(static_cast<const T*>(x), rows, cols, ld_x, q, ld_q, scales);
    return launch_status();
  });
}

}  // namespace td::kernels
