// The post-scale W8A8 GEMM (int8_gemm_post_scale_sm90.cu) for epilogues
// without a residual: y = acc·a_scale[m]·w_scale[n] + bias[n], and GELU-tanh
// in the kGelu instance (one instance per .cu file: each takes ~1 min to
// compile). Its epilogue visitor tree has only those leaves and
// no source operand. Why a second instance: the full kernel's tree (with the
// residual fetch and the per-element gate lookup, off at run time) made the
// plain GEMM 30-45% slower at K = 1536 on the H200 (session 16: 1.3B ffn1
// 0.90-0.93 against 0.615-0.618 ms, qkv 0.175 against 0.122-0.123; the same
// tile and schedule). The same fp32 expression as the full kernel's root
// with the residual off, so the same bits (GPU test
// GemmGpuPostScale.LeanEpilogueEqualsTheFullOneBitForBit).
#pragma once

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/gemm/int8_gemm.h"

namespace td::kernels::post_scale_lean {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;
using RasterOrder = cutlass::gemm::kernel::detail::RasterOrderOptions;

CUTLASS_DEVICE float gelu_tanh(float x) {
  // 0.5 x (1 + tanh(u)) == x / (1 + exp(-2u)): the same function without the
  // cancellation in 1 + tanh(u) for u << 0 (tiny outputs keep their accuracy).
  // ex2.approx and a fast divide: relative error ~1e-6, far below the bf16
  // output's 4e-3, at a fraction of the accurate expf + IEEE division.
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return __fdividef(x, 1.f + __expf(-2.f * u));
}

// The root: y = acc·sa·sw + bias, then GELU-tanh in the kGelu instance. A
// compile-time choice: with a runtime flag, as the full kernel's root has, the
// lean instance measured 11% slower at 1.3B qkv (0.135-0.136 against
// 0.122-0.123 ms, H200, session 16).
template <bool kGelu>
struct LeanFinish {
  template <class T>
  struct Fn {
    template <class Frg>
    CUTLASS_DEVICE Frg operator()(Frg const& acc, Frg const& sa, Frg const& sw, Frg const& bias) const {
      Frg y;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < Frg::kElements; ++i) {
        float v = acc[i] * sa[i] * sw[i] + bias[i];
        if constexpr (kGelu) v = gelu_tanh(v);
        y[i] = v;
      }
      return y;
    }
  };
};

template <class TileShape, class ClusterShape, class MainSchedule, class EpiSchedule, bool kGelu>
struct LeanGemm {
  using ElementOut = cutlass::bfloat16_t;
  using ActScaleCol = fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, int64_t>, 1>;
  using WeightScaleRow = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>;
  using BiasRow = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>;
  using Finish = fusion::Sm90Compute<LeanFinish<kGelu>::template Fn, ElementOut, float,
                                     cutlass::FloatRoundStyle::round_to_nearest>;
  using Tree = fusion::Sm90EVT<Finish, fusion::Sm90AccFetch, ActScaleCol, WeightScaleRow, BiasRow>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, void, cutlass::layout::RowMajor, 8, ElementOut,
      cutlass::layout::RowMajor, 8, EpiSchedule, Tree>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, cutlass::layout::RowMajor, 16, int8_t,
      cutlass::layout::ColumnMajor, 16, int32_t, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // Unsupported where the call has a residual (or a gate), or the shape is
  // not one this instance takes; the caller then runs the full kernel.
  // swizzle, raster: the full kernel's tile order.
  static Status run(const Int8GemmPostScaleArgs& args, int sm_count, int swizzle, RasterOrder raster, void* stream) {
    const Int8GemmOperands& op = args.op;
    const Int8GemmEpilogue& e = op.epilogue;
    if (e.residual || e.gate || (e.activation == GemmActivation::GeluTanh) != kGelu) return Status::Unsupported;
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    typename Gemm::Arguments arguments{};
    arguments.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    arguments.problem_shape = {int(op.M), int(op.N), int(op.K), 1};
    arguments.mainloop = {op.a, StrideA(make_stride(op.lda, _1{}, op.lda * op.M)), op.w,
                          StrideB(make_stride(op.ldw, _1{}, op.ldw * op.N))};
    arguments.epilogue.ptr_C = nullptr;
    arguments.epilogue.dC = StrideC{};
    arguments.epilogue.ptr_D = static_cast<ElementOut*>(op.out);
    arguments.epilogue.dD = StrideD(make_stride(op.ldo, _1{}, op.ldo * op.M));
    arguments.epilogue.thread = {
        {},                                              // accumulator
        {args.a_scale, 0.f, {_1{}, _0{}, int64_t(0)}},   // a_scale[m]
        {args.w_scale, 0.f, {_0{}, _1{}, int64_t(0)}},   // w_scale[n]
        {e.bias, 0.f, {_0{}, _1{}, int64_t(0)}},         // bias[n] (null -> 0)
        {},                                              // the root
    };
    arguments.hw_info.sm_count = sm_count;
    arguments.scheduler.max_swizzle_size = swizzle;
    arguments.scheduler.raster_order = raster;
    Gemm gemm;
    if (gemm.can_implement(arguments) != cutlass::Status::kSuccess) return Status::Unsupported;
    if (Gemm::get_workspace_size(arguments) != 0) return Status::Unsupported;
    auto cu_stream = static_cast<cudaStream_t>(stream);
    if (gemm.initialize(arguments, nullptr, cu_stream) != cutlass::Status::kSuccess) return Status::LaunchFailed;
    if (gemm.run(cu_stream) != cutlass::Status::kSuccess) return Status::LaunchFailed;
    return cudaPeekAtLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed;
  }
};

}  // namespace td::kernels::post_scale_lean
