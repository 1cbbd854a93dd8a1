// CUDA adaln_modulate (contract in adaln_modulate.h; fp32 reference in
// adaln_modulate_cpu.cpp): LN without affine, then * (1 + scale[b]) + shift[b].
//
// Design (shared row engine, norm_rows.cuh): as layer_norm, with the
// per-sample scale/shift row (b = row / rows_per_batch: skipped for a single
// sample, else a 32-bit division after the row's loads are issued; a 64-bit
// one up front measured 5% slower) read as fp32 through the read-only cache; all rows of a sample
// share it, so it costs L1/L2 traffic, not HBM. One pass: read x once with
// 16-byte loads into registers, two-pass statistics on the registers, one
// 16-byte store per chunk. Replaces PyTorch's eager fp32 sequence (upcast,
// layer_norm, mul, add, downcast: 5 kernels and ~10 passes over memory).
//
// Bytes moved (bf16 in and out): read x + write y = 4 bytes per element.
// Predicted at 4.0 TB/s:
//   32760 x 1536: 201.3 MB -> 50.3 us   (PyTorch eager fp32 648 us: 12.9x)
//   75600 x 5120: 1548.3 MB -> 387.1 us (PyTorch eager fp32 4883 us: 12.6x)
// Measured (H200, bench_norm, one run): 59.3 us = 85% of copy bandwidth; 426 us = 86%.
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/norm/adaln_modulate.h"
#include "kernels/norm/norm_host.h"
#include "kernels/norm/norm_lean.cuh"

namespace td::kernels {
namespace {

// AdaLnRows::Auto: TURBODIFF_ADALN_ROWS=one|lean (read per call, for A/B in
// benchmarks), else Lean (H200, 2026-11-30: 86.1-87.4% / 96.4-96.7% of copy
// against the row engine's 82.9-85.2% / 85.8-86.2% at 32760x1536 /
// 75600x5120). (Two rows per thread (Two) measured no gain, 64- / 128-thread
// CTAs (Cta64 / Cta128) +-1%, one FFMA for o * (1 + scale) + shift (LeanFma)
// -0.1 to -1.8% against Lean: removed.)
AdaLnRows resolve_rows(AdaLnRows v) {
  if (v != AdaLnRows::Auto) return v;
  const char* e = std::getenv("TURBODIFF_ADALN_ROWS");
  if (e != nullptr && std::strcmp(e, "one") == 0) return AdaLnRows::One;
  return AdaLnRows::Lean;
}

}  // namespace

Status adaln_modulate_cuda(const void* x, ElemType x_type, int64_t x_stride,
                           void* y, ElemType y_type, int64_t y_stride,
                           const float* scale, const float* shift, int64_t mod_stride, int64_t rows_per_batch,
                           int64_t rows, int64_t dim, float eps, void* stream, AdaLnRows rows_per_thread) {
  if (Status s = adaln_modulate_check(x, x_type, x_stride, y, y_type, y_stride, mod_stride, rows_per_batch,
                                      rows, dim, eps);
      s != Status::Ok)
    return s;
  if (rows == 0) return Status::Ok;
  using namespace gpu;
  const bool vectorized = dim % 8 == 0 && x_stride % 8 == 0 && y_stride % 8 == 0 && mod_stride % 4 == 0 &&
                          aligned16(x) && aligned16(y) && aligned16(scale) && aligned16(shift);
  const AdaLnRows variant = resolve_rows(rows_per_thread);
  RowPlan plan;
  if (!plan_rows(dim, vectorized, &plan, 8)) return Status::Unsupported;
  NormRowsArgs a;
  a.x = x;
  a.x_stride = x_stride;
  a.out = y;
  a.out_stride = y_stride;
  a.scale = scale;
  a.shift = shift;
  a.mod_stride = mod_stride;
  a.rows_per_batch = rows_per_batch;
  a.rows = rows;
  a.dim = int(dim);
  a.eps = eps;
  const auto cs = static_cast<cudaStream_t>(stream);
  return act_type_dispatch(x_type, [&](auto xt) {
    using XT = typename decltype(xt)::type;
    return act_type_dispatch(y_type, [&](auto yt) {
      using YT = typename decltype(yt)::type;
      if (variant == AdaLnRows::Lean) return launch_norm_lean<LeanOp::AdaLn, XT, YT>(a, plan, cs);
      return launch_norm_rows<NormKind::Layer, false, XT, XT, YT>(a, plan, cs);
    });
  });
}

}  // namespace td::kernels
