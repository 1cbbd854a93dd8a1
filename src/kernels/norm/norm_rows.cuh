// The row engine behind rms_norm, layer_norm, adaln_modulate and
// residual_gate_norm: one kernel template that reads a row once into
// registers (optionally forming x + gate * y and writing it back as the new
// residual), computes its statistics with exact two-pass fp32 sums, and
// writes the normalised row with optional affine and per-sample modulation.
//
// Each op's .cu fills NormRowsArgs, picks a RowPlan (norm_common.cuh) and
// calls launch_norm_rows with the element types; only the combinations an op
// dispatches to are instantiated.
//
// Per thread: kVPT chunks of kChunk elements of one row; all of the row's
// global loads are issued before the first use (bytes in flight), optional
// parameters (null pointers) are uniform branches, and no thread leaves early
// because row_sum may need every thread of the block at its barrier.
#pragma once

#include "kernels/norm/norm_common.cuh"

namespace td::kernels::gpu {

enum class NormKind { Rms, Layer };

struct NormRowsArgs {
  const void* x = nullptr;  // input rows (residual mode: the residual stream)
  int64_t x_stride = 0;
  const void* y = nullptr;  // residual mode: the sub-layer output added to x
  int64_t y_stride = 0;
  void* x_out = nullptr;  // residual mode: the new residual (may be x)
  int64_t x_out_stride = 0;
  void* out = nullptr;  // normalised rows
  int64_t out_stride = 0;
  const float* gate = nullptr;    // residual mode, per-sample rows, optional
  const float* weight = nullptr;  // [dim], optional
  const float* bias = nullptr;    // [dim], optional (Layer only)
  const float* scale = nullptr;   // per-sample rows, optional: * (1 + scale)
  const float* shift = nullptr;   // per-sample rows, optional: + shift
  int64_t mod_stride = 0;
  int64_t rows_per_batch = 1;
  int64_t rows = 0;
  int dim = 0;
  float eps = 0.f;
};

template <NormKind kKind, bool kResidual, typename XT, typename YT, typename OutT, int kChunk, int kVPT>
__global__ void __launch_bounds__(kMaxRowThreads) norm_rows_kernel(const NormRowsArgs a) {
  using XIO = ChunkIO<XT, kChunk>;
  using YIO = ChunkIO<YT, kChunk>;
  using OIO = ChunkIO<OutT, kChunk>;
  __shared__ float partials[2][32];

  const int tpr = int(blockDim.x);
  const int lane = int(threadIdx.x);
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool row_ok = row < a.rows;
  const int64_t r = row_ok ? row : 0;  // keeps every address in bounds; loads/stores stay predicated on row_ok
  const int nchunks = a.dim / kChunk;
  const bool per_sample = a.gate != nullptr || a.scale != nullptr || a.shift != nullptr;
  const int64_t mod_off = per_sample ? (r / a.rows_per_batch) * a.mod_stride : 0;

  // Chunks k < nvalid of this thread are inside the row (one integer rather
  // than kVPT predicates, which would overflow the 7 predicate registers).
  const int nvalid = row_ok ? min(kVPT, (nchunks - lane + tpr - 1) / tpr) : 0;

  // The row stays in registers in its storage type (packed 16-bit pairs for
  // bf16/fp16: half the registers of fp32 values) and is unpacked to fp32 in
  // each pass; unpacking is a shift or a cvt per element, far below the
  // arithmetic a memory-bound row can afford.
  typename XIO::Raw xr[kVPT];
  if constexpr (kResidual) {
    const XT* x = static_cast<const XT*>(a.x) + r * a.x_stride;
    const YT* y = static_cast<const YT*>(a.y) + r * a.y_stride;
    XT* x_out = static_cast<XT*>(a.x_out) + r * a.x_out_stride;
    typename YIO::Raw yr[kVPT];
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      const int c = (lane + k * tpr) * kChunk;
      if (k < nvalid) {
        xr[k] = XIO::load(x + c);
        yr[k] = YIO::load(y + c);
      }
    }
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      const int c = (lane + k * tpr) * kChunk;
      if (k < nvalid) {
        float xf[kChunk], yf[kChunk];
        XIO::unpack(xr[k], xf);
        YIO::unpack(yr[k], yf);
        if (a.gate) {
          float g[kChunk];
          load_params<kChunk>(a.gate + mod_off + c, g);
          // product rounded, then the sum: bit-identical to the eager x + gate * y
#pragma unroll
          for (int j = 0; j < kChunk; ++j) xf[j] = __fadd_rn(xf[j], __fmul_rn(g[j], yf[j]));
        } else {
#pragma unroll
          for (int j = 0; j < kChunk; ++j) xf[j] = __fadd_rn(xf[j], yf[j]);
        }
        xr[k] = XIO::pack(xf);  // the norm sees the residual as stored
        XIO::store(x_out + c, xr[k]);
      }
    }
  } else {
    const XT* x = static_cast<const XT*>(a.x) + r * a.x_stride;
#pragma unroll
    for (int k = 0; k < kVPT; ++k)
      if (k < nvalid) xr[k] = XIO::load(x + (lane + k * tpr) * kChunk);
  }

  // Statistics over the valid chunks only, in fp32.
  const float n = float(a.dim);
  float mean = 0.f;
  float rstd;
  if constexpr (kKind == NormKind::Layer) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k)
      if (k < nvalid) {
        float f[kChunk];
        XIO::unpack(xr[k], f);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) s += f[j];
      }
    mean = row_sum(s, partials[0]) / n;
    float s2 = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k)
      if (k < nvalid) {
        float f[kChunk];
        XIO::unpack(xr[k], f);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          const float d = f[j] - mean;
          s2 += d * d;
        }
      }
    rstd = rsqrtf(row_sum(s2, partials[1]) / n + a.eps);
  } else {
    float s2 = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k)
      if (k < nvalid) {
        float f[kChunk];
        XIO::unpack(xr[k], f);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) s2 += f[j] * f[j];
      }
    rstd = rsqrtf(row_sum(s2, partials[0]) / n + a.eps);
  }

  OutT* out = static_cast<OutT*>(a.out) + r * a.out_stride;
#pragma unroll
  for (int k = 0; k < kVPT; ++k) {
    if (k >= nvalid) continue;
    const int c = (lane + k * tpr) * kChunk;
    float o[kChunk];
    XIO::unpack(xr[k], o);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) o[j] = (o[j] - mean) * rstd;
    if (a.weight) {
      float w[kChunk];
      load_params<kChunk>(a.weight + c, w);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) o[j] *= w[j];
    }
    if (a.bias) {
      float b[kChunk];
      load_params<kChunk>(a.bias + c, b);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) o[j] += b[j];
    }
    if (a.scale) {
      float s[kChunk];
      load_params<kChunk>(a.scale + mod_off + c, s);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) o[j] *= 1.f + s[j];
    }
    if (a.shift) {
      float s[kChunk];
      load_params<kChunk>(a.shift + mod_off + c, s);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) o[j] += s[j];
    }
    OIO::store(out + c, OIO::pack(o));
  }
}

// Launches the kernel instantiation matching `plan` on rows [0, a.rows).
// Residual mode is planned with max_vpt = 6 and has no 8-chunk instantiation.
// XT is the input (residual) type, YT the added sub-layer output's type
// (residual mode only; pass XT otherwise), OutT the normalised output's.
template <NormKind kKind, bool kResidual, typename XT, typename YT, typename OutT>
Status launch_norm_rows(const NormRowsArgs& a, const RowPlan& plan, cudaStream_t stream) {
  if (a.rows == 0) return Status::Ok;
  const int64_t blocks = (a.rows + plan.rpb - 1) / plan.rpb;
  if (blocks > int64_t(INT32_MAX)) return Status::InvalidArgument;
  const dim3 grid{unsigned(blocks)};
  const dim3 block{unsigned(plan.tpr), unsigned(plan.rpb)};
  if (plan.chunk == 8 && plan.vpt == 4) {
    norm_rows_kernel<kKind, kResidual, XT, YT, OutT, 8, 4><<<grid, block, 0, stream>>>(a);
  } else if (plan.chunk == 8 && plan.vpt == 6) {
    norm_rows_kernel<kKind, kResidual, XT, YT, OutT, 8, 6><<<grid, block, 0, stream>>>(a);
  } else if (plan.chunk == 1 && plan.vpt == 16) {
    norm_rows_kernel<kKind, kResidual, XT, YT, OutT, 1, 16><<<grid, block, 0, stream>>>(a);
  } else if constexpr (!kResidual) {
    if (plan.chunk != 8 || plan.vpt != 8) return Status::InvalidArgument;  // a plan plan_rows never makes
    norm_rows_kernel<kKind, kResidual, XT, YT, OutT, 8, 8><<<grid, block, 0, stream>>>(a);
  } else {
    return Status::InvalidArgument;
  }
  return launch_status();
}

}  // namespace td::kernels::gpu
