// The CPU GEMM of a Linear layer, the fp32 reference path of every matmul in
// the model:
//
//   c[m, n] = sum_k a[m, k] * w[n, k]  (+ bias[n])
//
// i.e. y = x W^T + b with both operands K-contiguous ("TN": activations
// [M, K] and a torch Linear weight [N, K], each with its own row stride).
// Inputs may be F32, BF16 or F16 (widened to fp32 while packing), the output
// F32, BF16 or F16 (rounded once at the end); accumulation is fp32.
//
// Blocked for the caches (a K slice of A and of W packed into contiguous
// panels), an 8x8 register tile in the inner kernel (8-wide FMA on AVX2
// CPUs, 4-wide elsewhere), and the (M block, N block) tiles spread over
// td::parallel_for. The result does not depend on the thread count: each
// output element is summed in the same order.
// Must not be called from inside another td::parallel_for.
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

struct GemmF32Params {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // [m, lda]
  ElemType a_type = ElemType::F32;
  int64_t lda = 0;
  const void* w = nullptr;  // [n, ldw]
  ElemType w_type = ElemType::F32;
  int64_t ldw = 0;
  const void* bias = nullptr;  // [n] or null
  ElemType bias_type = ElemType::F32;
  void* c = nullptr;  // [m, ldc]; must not overlap a, w or bias
  ElemType c_type = ElemType::F32;
  int64_t ldc = 0;
  bool force_portable = false;  // use the 4-wide kernel even on AVX2 CPUs (tests cover both)
};

// Whether gemm_f32_cpu uses its AVX2/FMA kernel on this CPU.
bool gemm_f32_has_avx2();

// InvalidArgument for negative sizes, ld < k (or < n for c), null pointers
// with non-empty sizes, or element types other than F32/BF16/F16.
Status gemm_f32_check(const GemmF32Params& p);

Status gemm_f32_cpu(const GemmF32Params& p);

}  // namespace td::kernels
