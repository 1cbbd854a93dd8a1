// Device helpers of the SLA linear-branch kernels (sla_linear.cu): cp.async,
// ldmatrix, mma.sync m16n8k16 BF16 and the XOR-swizzled shared-memory tiles of
// the portable flash kernel (kernels/attention/flash_attention.cu: rows of
// 16-byte chunks, chunk index XOR (row & 7)).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace td::kernels::sla_device {

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of kChunks chunks per row.
template <int kChunks>
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  return uint32_t(row * kChunks * 16 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;  // 0: write 16 zero bytes, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a·b, m16n8k16, bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Copies kRows rows of D bf16 (row r at src + r * row_stride) into a swizzled
// tile with kThreads threads; rows at or past valid_rows are zero-filled.
template <int D, int kRows, int kThreads>
__device__ __forceinline__ void load_tile(uint32_t dst, const __nv_bfloat16* src, int64_t row_stride, int valid_rows,
                                          int tid) {
  constexpr int kChunks = D / 8;
  static_assert(kRows * kChunks % kThreads == 0, "tile must split evenly over the CTA");
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = i * kThreads + tid;
    const int row = idx / kChunks, chunk = idx % kChunks;
    const bool valid = row < valid_rows;
    cp_async_16(dst + swizzle<kChunks>(row, chunk), src + (valid ? int64_t(row) * row_stride : 0) + chunk * 8, valid);
  }
}

}  // namespace td::kernels::sla_device
