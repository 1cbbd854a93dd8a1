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

#include <cstdlib>
#include <cstring>

#include "kernels/norm/norm_common.cuh"
#include "kernels/norm/norm_variant.h"
#include "kernels/quant/quant_device.cuh"

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
  // kQuant: the normalised rows, rounded to OutT, quantized in 1 x 128 groups
  // (token128: codes [rows, dim] `codes_stride` apart, one fp32 scale per
  // group at code_scales[group * ld_scales + row]); `out` optional then.
  int8_t* codes = nullptr;
  int64_t codes_stride = 0;
  float* code_scales = nullptr;
  int64_t ld_scales = 0;
};

// One row's work, split so that a thread can issue the loads of its next row
// before it finishes the current one: load() issues every global load of the
// row (x, and y in residual mode) into registers, finish() does the rest.
template <NormKind kKind, bool kResidual, typename XT, typename YT, typename OutT, int kChunk, int kVPT,
          bool kQuant = false>
struct NormRowOps {
  static_assert(!kQuant || kChunk == 8, "kQuant: the vector path (a 128-column group is 16 chunks)");
  using XIO = ChunkIO<XT, kChunk>;
  using YIO = ChunkIO<YT, kChunk>;
  using OIO = ChunkIO<OutT, kChunk>;

  // The row stays in registers in its storage type (packed 16-bit pairs for
  // bf16/fp16: half the registers of fp32 values) and is unpacked to fp32 in
  // each pass; unpacking is a shift or a cvt per element, far below the
  // arithmetic a memory-bound row can afford.
  struct Loaded {
    typename XIO::Raw x[kVPT];
    typename YIO::Raw y[kResidual ? kVPT : 1];
  };

  // How many of this thread's kVPT chunks lie inside row `row` (0 past the
  // last row): one integer rather than kVPT predicates, which would overflow
  // the 7 predicate registers.
  __device__ __forceinline__ static int valid_chunks(const NormRowsArgs& a, int64_t row) {
    const int tpr = int(blockDim.x);
    return row < a.rows ? min(kVPT, (a.dim / kChunk - int(threadIdx.x) + tpr - 1) / tpr) : 0;
  }

  __device__ __forceinline__ static void load(const NormRowsArgs& a, int64_t row, int nvalid, Loaded& l) {
    const int tpr = int(blockDim.x), lane = int(threadIdx.x);
    const int64_t r = nvalid > 0 ? row : 0;  // every address in bounds; the loads are predicated anyway
    const XT* x = static_cast<const XT*>(a.x) + r * a.x_stride;
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      if (k < nvalid) {
        const int c = (lane + k * tpr) * kChunk;
        l.x[k] = XIO::load(x + c);
        if constexpr (kResidual) l.y[k] = YIO::load(static_cast<const YT*>(a.y) + r * a.y_stride + c);
      }
    }
  }

  // Offset of row r's per-sample parameter row (gate, scale, shift). A 64-bit
  // division is a ~70-instruction subroutine: skip it for a single sample and
  // use the 32-bit one whenever the operands fit.
  __device__ __forceinline__ static int64_t sample_offset(const NormRowsArgs& a, int64_t r) {
    if (a.rows_per_batch >= a.rows) return 0;
    const int64_t b = (r <= int64_t(UINT32_MAX) && a.rows_per_batch <= int64_t(UINT32_MAX))
                          ? int64_t(uint32_t(r) / uint32_t(a.rows_per_batch))
                          : r / a.rows_per_batch;
    return b * a.mod_stride;
  }

  // Residual update (residual mode), statistics, normalisation and stores of
  // row `row`. Every thread of the block must call it (the reduction's
  // barrier); `partials` is 2 * 32 floats of shared memory (one array per reduction).
  __device__ __forceinline__ static void finish(const NormRowsArgs& a, int64_t row, int nvalid, Loaded& l,
                                                float* partials) {
    const int tpr = int(blockDim.x), lane = int(threadIdx.x);
    const int64_t r = nvalid > 0 ? row : 0;
    const bool per_sample = a.gate != nullptr || a.scale != nullptr || a.shift != nullptr;
    const int64_t mod_off = per_sample && nvalid > 0 ? sample_offset(a, r) : 0;

    if constexpr (kResidual) {
      XT* x_out = static_cast<XT*>(a.x_out) + r * a.x_out_stride;
#pragma unroll
      for (int k = 0; k < kVPT; ++k) {
        if (k < nvalid) {
          const int c = (lane + k * tpr) * kChunk;
          float xf[kChunk], yf[kChunk];
          XIO::unpack(l.x[k], xf);
          YIO::unpack(l.y[k], yf);
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
          l.x[k] = XIO::pack(xf);  // the norm sees the residual as stored
          XIO::store(x_out + c, l.x[k]);
        }
      }
    }

    // Statistics over the valid chunks only, in fp32. LayerNorm: exact two
    // passes over the registers (the mean, then the squared deviations from
    // it), two row reductions. (A single reduction merging per-thread
    // (count, mean, M2) triples measured slower on the H200: the merge's
    // longer dependency chain costs more than the second reduction.)
    float mean = 0.f;
    float rstd;
    if constexpr (kKind == NormKind::Layer) {
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < kVPT; ++k)
        if (k < nvalid) {
          float f[kChunk];
          XIO::unpack(l.x[k], f);
#pragma unroll
          for (int j = 0; j < kChunk; ++j) s += f[j];
        }
      mean = row_sum(s, partials) / float(a.dim);
      float s2 = 0.f;
#pragma unroll
      for (int k = 0; k < kVPT; ++k)
        if (k < nvalid) {
          float f[kChunk];
          XIO::unpack(l.x[k], f);
#pragma unroll
          for (int j = 0; j < kChunk; ++j) {
            const float d = f[j] - mean;
            s2 += d * d;
          }
        }
      rstd = rsqrtf(row_sum(s2, partials + 32) / float(a.dim) + a.eps);
    } else {
      float s2 = 0.f;
#pragma unroll
      for (int k = 0; k < kVPT; ++k)
        if (k < nvalid) {
          float f[kChunk];
          XIO::unpack(l.x[k], f);
#pragma unroll
          for (int j = 0; j < kChunk; ++j) s2 += f[j] * f[j];
        }
      rstd = rsqrtf(row_sum(s2, partials) / float(a.dim) + a.eps);
    }

    OutT* out = static_cast<OutT*>(a.out) + r * a.out_stride;
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      if (k >= nvalid) continue;
      const int c = (lane + k * tpr) * kChunk;
      float o[kChunk];
      XIO::unpack(l.x[k], o);
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
      if constexpr (kQuant) {
        // The values as the unfused path sees them (rounded to OutT), the
        // group's amax over the 16 lanes holding its 16 chunks (the caller
        // guarantees whole groups, the same valid chunks in every lane of a
        // warp and rows of whole warps), then quantize_token128's formulas.
        const typename OIO::Raw packed = OIO::pack(o);
        if (a.out) OIO::store(out + c, packed);
        float f[8];
        OIO::unpack(packed, f);
        const float amax = qdev::group_max<16>(qdev::absmax8(f));
        const QuantParams qp = qdev::symmetric_params_dev(amax);
        *reinterpret_cast<uint2*>(a.codes + r * a.codes_stride + c) = qdev::quantize8_prmt(f, qp.inv);
        if ((lane & 15) == 0) a.code_scales[int64_t(c / 128) * a.ld_scales + r] = qp.scale;
      } else {
        OIO::store(out + c, OIO::pack(o));
      }
    }
  }
};

// One group of blockDim.y rows per block, one row per blockDim.x threads.
// (A loop over several groups per block, with or without prefetching the
// next row, measured slower on the H200: the compiler keeps the
// loop-invariant parameter vectors in registers, which costs occupancy.)
template <NormKind kKind, bool kResidual, typename XT, typename YT, typename OutT, int kChunk, int kVPT,
          bool kQuant = false>
__global__ void __launch_bounds__(kMaxRowThreads) norm_rows_kernel(const NormRowsArgs a) {
  using Ops = NormRowOps<kKind, kResidual, XT, YT, OutT, kChunk, kVPT, kQuant>;
  __shared__ float partials[2 * 32];
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const int nvalid = Ops::valid_chunks(a, row);
  typename Ops::Loaded l;
  Ops::load(a, row, nvalid, l);
  Ops::finish(a, row, nvalid, l, partials);
}

template <NormKind kKind, bool kResidual, typename XT, typename YT, typename OutT, bool kQuant = false>
Status launch_norm_rows(const NormRowsArgs& a, const RowPlan& plan, cudaStream_t stream) {
  if (a.rows == 0) return Status::Ok;
  if constexpr (kQuant) {
    // whole 128-column groups, every lane of a warp with the same chunks, a row of whole warps
    if (plan.chunk != 8 || a.dim % 128 != 0 || plan.tpr % 32 != 0 || (a.dim / 8) % plan.tpr != 0 ||
        a.dim / 8 / plan.tpr > plan.vpt)
      return Status::Unsupported;
    const int64_t blocks = (a.rows + plan.rpb - 1) / plan.rpb;
    if (blocks > int64_t(INT32_MAX)) return Status::InvalidArgument;
    const dim3 grid{unsigned(blocks)}, block{unsigned(plan.tpr), unsigned(plan.rpb)};
    if (plan.vpt == 4) norm_rows_kernel<kKind, kResidual, XT, YT, OutT, 8, 4, true><<<grid, block, 0, stream>>>(a);
    else if (plan.vpt == 6) norm_rows_kernel<kKind, kResidual, XT, YT, OutT, 8, 6, true><<<grid, block, 0, stream>>>(a);
    else return Status::Unsupported;
    return launch_status();
  }
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

// NormRowsKernel::Auto -> TURBODIFF_NORM_KERNEL=rows|lean (read per call, for
// A/B in benchmarks), else the op's default.
inline NormRowsKernel resolve_norm_rows_kernel(NormRowsKernel k, NormRowsKernel op_default) {
  if (k != NormRowsKernel::Auto) return k;
  const char* e = std::getenv("TURBODIFF_NORM_KERNEL");
  if (e != nullptr && std::strcmp(e, "rows") == 0) return NormRowsKernel::Rows;
  if (e != nullptr && std::strcmp(e, "lean") == 0) return NormRowsKernel::Lean;
  return op_default;
}

}  // namespace td::kernels::gpu
