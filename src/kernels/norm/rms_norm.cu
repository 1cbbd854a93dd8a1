// CUDA rms_norm (contract in rms_norm.h; fp32 reference in rms_norm_cpu.cpp).
//
// Design (shared row engine, norm_rows.cuh): a row is held in registers, read
// from global memory once with 16-byte loads (8 elements per chunk: LDG.E.128
// for bf16/fp16, two for fp32), reduced (sum of squares) across the threads of
// the row, scaled and written with 16-byte stores. Rows up to 2048 elements
// use a warp or less per row (1536 = 32 threads x 6 chunks, one row per
// 32-thread block, shuffles only); wider rows use several warps per row with
// one partial per warp in shared memory (5120 = 160 threads x 4 chunks, one
// row per block). All of a thread's loads are issued before the first
// arithmetic; with ~54 registers an SM holds ~32 rows (~100 KB) in flight.
// Misaligned pointers/strides or dim % 8 != 0 take a scalar path (1 element
// per chunk, 16 per thread, dim <= 8192).
//
// Bytes moved (bf16 in and out): read x + write y = 4 bytes per element
// (weight: dim * 4 bytes, cached). Predicted at 4.0 TB/s:
//   32760 x 1536: 201.3 MB -> 50.3 us   (PyTorch 79 us, TurboDiffusion Triton 102 us)
//   75600 x 5120: 1548.3 MB -> 387.1 us (PyTorch 468 us, TurboDiffusion Triton 475 us)
// Measured (H200, bench_norm, one run): 55.7 us = 90% of copy bandwidth; 374 us = 97.5%.
#include "kernels/norm/norm_host.h"
#include "kernels/norm/norm_lean.cuh"
#include "kernels/norm/rms_norm.h"

namespace td::kernels {

Status rms_norm_cuda(const void* x, ElemType x_type, int64_t x_stride,
                     void* y, ElemType y_type, int64_t y_stride,
                     const float* weight, int64_t rows, int64_t dim, float eps, void* stream,
                     NormRowsKernel kernel) {
  if (Status s = rms_norm_check(x, x_type, x_stride, y, y_type, y_stride, rows, dim, eps); s != Status::Ok)
    return s;
  if (rows == 0) return Status::Ok;
  using namespace gpu;
  const bool vectorized = dim % 8 == 0 && x_stride % 8 == 0 && y_stride % 8 == 0 && aligned16(x) &&
                          aligned16(y) && aligned16(weight);
  // The row engine by default: Lean measured 89.9-90.9% / 96.0-96.8% of copy
  // against its 89.1-90.3% / 97.3-97.8% on the H200 (2026-11-30), no clear gain.
  const NormRowsKernel variant = resolve_norm_rows_kernel(kernel, NormRowsKernel::Rows);
  RowPlan plan;
  if (!plan_rows(dim, vectorized, &plan, 8, kRowBlockThreads)) return Status::Unsupported;
  NormRowsArgs a;
  a.x = x;
  a.x_stride = x_stride;
  a.out = y;
  a.out_stride = y_stride;
  a.weight = weight;
  a.rows = rows;
  a.dim = int(dim);
  a.eps = eps;
  const auto cs = static_cast<cudaStream_t>(stream);
  return act_type_dispatch(x_type, [&](auto xt) {
    using XT = typename decltype(xt)::type;
    return act_type_dispatch(y_type, [&](auto yt) {
      using YT = typename decltype(yt)::type;
      if (variant == NormRowsKernel::Lean) return launch_norm_lean<LeanOp::Rms, XT, YT>(a, plan, cs);
      return launch_norm_rows<NormKind::Rms, false, XT, XT, YT>(a, plan, cs);
    });
  });
}

}  // namespace td::kernels
