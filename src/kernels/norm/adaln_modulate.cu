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

// AdaLnRows::Two (variant beside the row engine's kernel, same arithmetic in
// the same order): each thread holds the same chunks of 2 consecutive rows
// (the plan's threads per row and rows per block, each "row slot" now
// owning 2 rows), issues all their loads first, and reads each chunk's fp32
// scale and shift (16 bytes of parameters per 8 elements: 2-4x the L1
// traffic of the bf16 row itself in the one-row kernel) once for both rows
// while they belong to the same sample. Vector path only; the rows must fit
// in 64 registers per thread (bf16/fp16 rows up to 8 chunks per thread,
// fp32 up to 4), else the default kernel runs.
// Predicted: adaln_modulate 83-84% -> ~90% of copy bandwidth (the parameter
// L1 traffic halves and the bytes in flight per thread double).
template <typename XT, typename OutT, int kVPT>
__global__ void __launch_bounds__(gpu::kMaxRowThreads) adaln_two_rows_kernel(const gpu::NormRowsArgs a) {
  using namespace gpu;
  constexpr int R = 2;
  using XIO = ChunkIO<XT, 8>;
  using OIO = ChunkIO<OutT, 8>;
  __shared__ float partials[2 * R * 32];
  const int tpr = int(blockDim.x), lane = int(threadIdx.x);
  const int64_t row0 = (int64_t(blockIdx.x) * blockDim.y + threadIdx.y) * R;
  const int nchunks = a.dim / 8;

  typename XIO::Raw x[R][kVPT];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const bool ok = row0 + i < a.rows;
    const XT* xr = static_cast<const XT*>(a.x) + (ok ? row0 + i : 0) * a.x_stride;
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      const int c = lane + k * tpr;
      if (ok && c < nchunks) {
        x[i][k] = XIO::load(xr + c * 8);
      } else {
#pragma unroll
        for (int w = 0; w < XIO::kWords; ++w) x[i][k].w[w] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
  // Statistics per row as the row engine computes them (valid chunks only,
  // two passes, row_sum with a distinct partials array per call).
  float mean[R], rstd[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k)
      if (lane + k * tpr < nchunks) {
        float f[8];
        XIO::unpack(x[i][k], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) s += f[j];
      }
    mean[i] = row_sum(s, partials + (2 * i) * 32) / float(a.dim);
    float s2 = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k)
      if (lane + k * tpr < nchunks) {
        float f[8];
        XIO::unpack(x[i][k], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float d = f[j] - mean[i];
          s2 += d * d;
        }
      }
    rstd[i] = rsqrtf(row_sum(s2, partials + (2 * i + 1) * 32) / float(a.dim) + a.eps);
  }
  int64_t mod_off[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = row0 + i < a.rows ? row0 + i : a.rows - 1;
    int64_t b = 0;
    if (a.rows_per_batch < a.rows)
      b = (r <= int64_t(UINT32_MAX) && a.rows_per_batch <= int64_t(UINT32_MAX))
              ? int64_t(uint32_t(r) / uint32_t(a.rows_per_batch))
              : r / a.rows_per_batch;
    mod_off[i] = b * a.mod_stride;
  }
#pragma unroll
  for (int k = 0; k < kVPT; ++k) {
    const int c = lane + k * tpr;
    if (c >= nchunks) continue;
    float sc[8], sh[8];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (row0 + i >= a.rows) continue;
      if (i == 0 || mod_off[i] != mod_off[i - 1]) {
        load_params<8>(a.scale + mod_off[i] + c * 8, sc);
        load_params<8>(a.shift + mod_off[i] + c * 8, sh);
      }
      float o[8];
      XIO::unpack(x[i][k], o);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = (o[j] - mean[i]) * rstd[i];
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] *= 1.f + sc[j];
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] += sh[j];
      OIO::store(static_cast<OutT*>(a.out) + (row0 + i) * a.out_stride + c * 8, OIO::pack(o));
    }
  }
}

// The variant AdaLnRows::Auto means: TURBODIFF_ADALN_ROWS=2|cta64|cta128|lean|lean_fma (read per
// call, for A/B in benchmarks), else the one-row default.
AdaLnRows resolve_rows(AdaLnRows v) {
  if (v != AdaLnRows::Auto) return v;
  const char* e = std::getenv("TURBODIFF_ADALN_ROWS");
  if (e != nullptr && std::strcmp(e, "2") == 0) return AdaLnRows::Two;
  if (e != nullptr && std::strcmp(e, "cta64") == 0) return AdaLnRows::Cta64;
  if (e != nullptr && std::strcmp(e, "cta128") == 0) return AdaLnRows::Cta128;
  if (e != nullptr && std::strcmp(e, "lean") == 0) return AdaLnRows::Lean;
  if (e != nullptr && std::strcmp(e, "lean_fma") == 0) return AdaLnRows::LeanFma;
  return AdaLnRows::One;
}

template <typename XT, typename OutT>
Status launch_two_rows(const gpu::NormRowsArgs& a, const gpu::RowPlan& plan, cudaStream_t stream) {
  using namespace gpu;
  constexpr int kWords = ChunkIO<XT, 8>::kWords;
  const int64_t rows_per_block = int64_t(plan.rpb) * 2;
  const int64_t blocks = (a.rows + rows_per_block - 1) / rows_per_block;
  if (blocks > int64_t(INT32_MAX)) return Status::InvalidArgument;
  const dim3 grid{unsigned(blocks)};
  const dim3 block{unsigned(plan.tpr), unsigned(plan.rpb)};
  auto go = [&](auto vpt) -> Status {
    constexpr int V = decltype(vpt)::value;
    if constexpr (2 * V * kWords <= 16) {
      adaln_two_rows_kernel<XT, OutT, V><<<grid, block, 0, stream>>>(a);
      return launch_status();
    } else {
      return launch_norm_rows<NormKind::Layer, false, XT, XT, OutT>(a, plan, stream);
    }
  };
  if (plan.vpt == 4) return go(std::integral_constant<int, 4>{});
  if (plan.vpt == 6) return go(std::integral_constant<int, 6>{});
  if (plan.vpt == 8) return go(std::integral_constant<int, 8>{});
  return launch_norm_rows<NormKind::Layer, false, XT, XT, OutT>(a, plan, stream);
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
  const int block_threads = variant == AdaLnRows::Cta64 ? 64 : variant == AdaLnRows::Cta128 ? 128 : kRowBlockThreads;
  RowPlan plan;
  if (!plan_rows(dim, vectorized, &plan, 8, block_threads)) return Status::Unsupported;
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
  const bool two_rows = plan.chunk == 8 && variant == AdaLnRows::Two;
  return act_type_dispatch(x_type, [&](auto xt) {
    using XT = typename decltype(xt)::type;
    return act_type_dispatch(y_type, [&](auto yt) {
      using YT = typename decltype(yt)::type;
      if (two_rows) return launch_two_rows<XT, YT>(a, plan, cs);
      if (variant == AdaLnRows::Lean || variant == AdaLnRows::LeanFma)
        return launch_norm_lean<LeanOp::AdaLn, XT, YT>(a, plan, cs, variant == AdaLnRows::LeanFma);
      return launch_norm_rows<NormKind::Layer, false, XT, XT, YT>(a, plan, cs);
    });
  });
}

}  // namespace td::kernels
