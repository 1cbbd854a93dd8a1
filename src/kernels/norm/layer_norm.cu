// CUDA layer_norm (contract in layer_norm.h; fp32 reference in layer_norm_cpu.cpp).
//
// Design (shared row engine, norm_rows.cuh): the row is read once with 16-byte
// loads into registers (1536 = one warp x 6 chunks of 8, 5120 = 160 threads x
// 4 chunks), mean and variance are exact two-pass sums over the registers
// (two row reductions: shuffles, plus one shared-memory step and barrier each
// for rows wider than a warp), and the row is normalised, scaled and shifted
// (weight/bias fp32 through the read-only cache) and stored with 16-byte
// stores. No second pass over global memory.
//
// Bytes moved (bf16 in and out): read x + write y = 4 bytes per element.
// Predicted at 4.0 TB/s:
//   32760 x 1536: 201.3 MB -> 50.3 us   (PyTorch 122 us, TurboDiffusion Triton 148 us)
//   75600 x 5120: 1548.3 MB -> 387.1 us (PyTorch 525 us, TurboDiffusion Triton 687 us)
// Measured (H200, bench_norm, one run): 58.0 us = 87% of copy bandwidth; 408 us = 89%.
#include "kernels/norm/layer_norm.h"
#include "kernels/norm/norm_host.h"
#include "kernels/norm/norm_lean.cuh"

namespace td::kernels {

Status layer_norm_cuda(const void* x, ElemType x_type, int64_t x_stride,
                       void* y, ElemType y_type, int64_t y_stride,
                       const float* weight, const float* bias, int64_t rows, int64_t dim, float eps,
                       void* stream, NormRowsKernel kernel) {
  if (Status s = layer_norm_check(x, x_type, x_stride, y, y_type, y_stride, rows, dim, eps); s != Status::Ok)
    return s;
  if (rows == 0) return Status::Ok;
  using namespace gpu;
  const bool vectorized = dim % 8 == 0 && x_stride % 8 == 0 && y_stride % 8 == 0 && aligned16(x) &&
                          aligned16(y) && aligned16(weight) && aligned16(bias);
  // Lean by default (H200, 2026-11-30: 86.9-88.4% / 95.6-96.3% of copy against
  // the row engine's 84.2-86.4% / 89.4-89.7% at 32760x1536 / 75600x5120).
  const NormRowsKernel variant = resolve_norm_rows_kernel(kernel, NormRowsKernel::Lean);
  RowPlan plan;
  if (!plan_rows(dim, vectorized, &plan, 8, kRowBlockThreads)) return Status::Unsupported;
  NormRowsArgs a;
  a.x = x;
  a.x_stride = x_stride;
  a.out = y;
  a.out_stride = y_stride;
  a.weight = weight;
  a.bias = bias;
  a.rows = rows;
  a.dim = int(dim);
  a.eps = eps;
  const auto cs = static_cast<cudaStream_t>(stream);
  return act_type_dispatch(x_type, [&](auto xt) {
    using XT = typename decltype(xt)::type;
    return act_type_dispatch(y_type, [&](auto yt) {
      using YT = typename decltype(yt)::type;
      if (variant == NormRowsKernel::Lean) return launch_norm_lean<LeanOp::Layer, XT, YT>(a, plan, cs);
      return launch_norm_rows<NormKind::Layer, false, XT, XT, YT>(a, plan, cs);
    });
  });
}

}  // namespace td::kernels
