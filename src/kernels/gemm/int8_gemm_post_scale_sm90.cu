// Post-scale W8A8 GEMM for Hopper (sm_90a): one CUTLASS 3.x instantiation.
//
// Mainloop: the sm90 collective builder's TMA + wgmma warp-specialized
// "ping-pong" mainloop, int8 x int8 -> int32, 128x128x128 tiles: each of the
// two consumer warpgroups owns a whole tile (2 x wgmma m64n128k32 per K step
// of 32, 128 int32 accumulators per thread) and the two alternate, so one
// warpgroup's epilogue runs while the other's MMAs keep the tensor cores busy.
// (The cooperative schedule, both warpgroups on one 128x256 tile, measured
// 0.9-1.0x BF16 at K = 1536 on the H200: its epilogue, run by only 8 warps
// per SM with no MMA beside it, cost as much as the K loop.) Clusters of 2
// along M multicast the weight tile to both CTAs; as many smem stages as fit
// beside the epilogue; persistent CTAs. The int32 accumulation runs over all
// of K without rounding; scales come in the epilogue only.
//
// Epilogue: an epilogue visitor tree (EVT) on the TMA warp-specialized
// epilogue. Leaves: the accumulator, a_scale[m] (column broadcast), w_scale[n]
// and bias[n] (row broadcasts, null bias -> 0), the residual (the epilogue's
// source operand C, loaded by TMA only when the call has one: a runtime flag,
// so calls without a residual read no C) and the gate (looked up per element
// at [m / rows_per_batch, n]; L1-resident, [batches, N] fp32). The root
// computes y = acc * sa * sw + bias, GELU-tanh and the gated residual under
// runtime flags, in fp32, and rounds once to bf16, which a TMA store writes.
// One instantiation serves every epilogue variant: the flags cost a few
// uniform branches per fragment, nothing in the mainloop. But the tree itself
// costs: calls without a residual go to the lean instances
// (int8_gemm_post_scale_lean_sm90.cuh), 30-45% faster at K = 1536.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <mutex>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/gemm/int8_gemm.h"
#include "kernels/gemm/int8_gemm_post_scale_lean_sm90.cuh"

namespace td::kernels {

// The lean instances (int8_gemm_post_scale_lean[_gelu]_sm90.cu): calls without a residual.
Status int8_gemm_post_scale_sm90_lean(const Int8GemmPostScaleArgs& args, int sm_count, int swizzle,
                                      post_scale_lean::RasterOrder raster, void* stream);
Status int8_gemm_post_scale_sm90_lean_gelu(const Int8GemmPostScaleArgs& args, int sm_count, int swizzle,
                                           post_scale_lean::RasterOrder raster, void* stream);

namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// ---- custom EVT leaves --------------------------------------------------------

// The residual (bf16 C operand). Like CUTLASS's source fetch, but whether C is
// loaded at all is a runtime argument rather than a type.
struct ResidualFetch {
  struct SharedStorage {};
  struct Arguments {
    bool enabled = false;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE ResidualFetch() {}
  CUTLASS_HOST_DEVICE ResidualFetch(Params const& params_, SharedStorage const&) : params(params_) {}
  Params params;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return params.enabled; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return params.enabled; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(fusion::detail::ProducerLoadArgs<Args...> const&) {
    return fusion::EmptyProducerLoadCallbacks{};
  }

  template <class SrcTensor>
  struct ConsumerStoreCallbacks : fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE explicit ConsumerStoreCallbacks(SrcTensor const& tCrC_) : tCrC(tCrC_) {}
    SrcTensor const& tCrC;  // (CPY, CPY_M, CPY_N): this subtile's C in registers

    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<typename SrcTensor::value_type, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int) {
      return recast<cutlass::Array<typename SrcTensor::value_type, FragmentSize>>(tCrC)(epi_v);
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    using SrcTensor = cute::remove_cvref_t<decltype(args.tCrC)>;
    return ConsumerStoreCallbacks<SrcTensor>(args.tCrC);
  }
};

// gate[m / rows_per_batch, n] per output element (1 where there is no gate or
// the element lies outside the matrix). The coordinates come from the
// epilogue's per-thread coordinate tensor, which is relative to the thread's
// first element; residue = (M, N) - that element's absolute coordinate.
struct GateFetch {
  struct SharedStorage {};
  struct Arguments {
    const float* gate = nullptr;
    int64_t ld_gate = 0;
    int rows_per_batch = 1;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.gate == nullptr || args.rows_per_batch >= 1;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE GateFetch() {}
  CUTLASS_HOST_DEVICE GateFetch(Params const& params_, SharedStorage const&) : params(params_) {}
  Params params;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(fusion::detail::ProducerLoadArgs<Args...> const&) {
    return fusion::EmptyProducerLoadCallbacks{};
  }

  template <class CoordTensor, class Residue>
  struct ConsumerStoreCallbacks : fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CoordTensor tCcD_, Residue residue_, int m_first_, int n_first_,
                                          Params const& params_)
        : tCcD(tCcD_), residue(residue_), m_first(m_first_), n_first(n_first_), params(params_) {}
    CoordTensor tCcD;  // (CPY, CPY_M, CPY_N, EPI_M, EPI_N) relative coordinates
    Residue residue;
    int m_first, n_first;
    Params const& params;

    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize> visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v,
                                                    int epi_m, int epi_n) {
      cutlass::Array<float, FragmentSize> g;
      if (params.gate == nullptr) {
        g.fill(1.f);
        return g;
      }
      Tensor c = tCcD(_, _, _, epi_m, epi_n);
      // one sample (rows_per_batch >= M, Wan's usual case): no division
      const bool one_batch = params.rows_per_batch >= m_first + int(get<0>(residue));
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        auto rel = c(epi_v * FragmentSize + i);
        g[i] = 1.f;
        if (elem_less(rel, residue)) {
          const int m = m_first + int(get<0>(rel));
          const int n = n_first + int(get<1>(rel));
          const int b = one_batch ? 0 : m / params.rows_per_batch;
          g[i] = __ldg(params.gate + int64_t(b) * params.ld_gate + n);
        }
      }
      return g;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    const int m_first = int(M) - int(get<0>(args.residue_tCcD));
    const int n_first = int(N) - int(get<1>(args.residue_tCcD));
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        args.tCcD, args.residue_tCcD, m_first, n_first, params);
  }
};

// ---- the root: scale, bias, activation, gated residual --------------------------

struct EpilogueFlags {
  int gelu = 0;
  int residual = 0;
};

using post_scale_lean::gelu_tanh;  // the lean instance's, so both give the same bits

// Sm90Compute calls this with fp32 fragments (the int32 accumulator and the
// bf16 residual converted by round-to-nearest), plus the flags.
template <class T>
struct PostScaleFinish {
  using Arguments = EpilogueFlags;
  template <class Frg>
  CUTLASS_DEVICE Frg operator()(Frg const& acc, Frg const& sa, Frg const& sw, Frg const& bias, Frg const& residual,
                                Frg const& gate, Arguments const& flags) const {
    Frg y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < Frg::kElements; ++i) {
      float v = acc[i] * sa[i] * sw[i] + bias[i];
      if (flags.gelu) v = gelu_tanh(v);
      if (flags.residual) v = residual[i] + gate[i] * v;
      y[i] = v;
    }
    return y;
  }
};

// ---- the kernel type ----------------------------------------------------------

using ElementOut = cutlass::bfloat16_t;
using TileShape = Shape<_128, _128, _128>;
using ClusterShape = Shape<_2, _1, _1>;

using ActScaleCol = fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, int64_t>, 1>;
using WeightScaleRow = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>;
using BiasRow = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>;
using Finish = fusion::Sm90Compute<PostScaleFinish, ElementOut, float, cutlass::FloatRoundStyle::round_to_nearest>;
using EpilogueTree =
    fusion::Sm90EVT<Finish, fusion::Sm90AccFetch, ActScaleCol, WeightScaleRow, BiasRow, ResidualFetch, GateFetch>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, ElementOut, cutlass::layout::RowMajor, 8,
    ElementOut, cutlass::layout::RowMajor, 8, cutlass::epilogue::TmaWarpSpecialized,
    EpilogueTree>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, cutlass::layout::RowMajor, 16, int8_t,
    cutlass::layout::ColumnMajor, 16, int32_t, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;

using GemmKernel =
    cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

// SM count and compute capability per device, read once.
struct DeviceFacts {
  int sm_count = 0, cc = 0;
};
DeviceFacts device_facts(int device) {
  static std::mutex mu;
  static DeviceFacts facts[64];
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= 64) return {};
  DeviceFacts& f = facts[device];
  if (f.sm_count == 0) {
    int major = 0, minor = 0, sms = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      return {};
    f.sm_count = sms;
    f.cc = major * 10 + minor;
  }
  return f;
}

// Benchmark overrides of the tile order, read once from the environment:
// TURBODIFF_GEMM_SM90_SWIZZLE (1, 2, 4, 8) and TURBODIFF_GEMM_SM90_RASTER (m, n).
struct SchedulerTuning {
  int swizzle = 0;   // 0: the heuristic above
  char raster = 0;   // 0: CUTLASS's heuristic
};
SchedulerTuning scheduler_tuning() {
  static const SchedulerTuning tuning = [] {
    SchedulerTuning t;
    if (const char* s = std::getenv("TURBODIFF_GEMM_SM90_SWIZZLE")) {
      const int v = std::atoi(s);
      if (v == 1 || v == 2 || v == 4 || v == 8) t.swizzle = v;
    }
    if (const char* r = std::getenv("TURBODIFF_GEMM_SM90_RASTER")) {
      if (r[0] == 'm' || r[0] == 'n') t.raster = r[0];
    }
    return t;
  }();
  return tuning;
}

}  // namespace

Status int8_gemm_post_scale_sm90(const Int8GemmPostScaleArgs& args, void* stream) {
  if (Status s = int8_gemm_post_scale_check(args); s != Status::Ok) return s;
  const Int8GemmOperands& op = args.op;
  if (op.M == 0 || op.N == 0) return Status::Ok;
  if (int8_gemm_cuda_supported(op, args.a_scale, args.w_scale) != Status::Ok) return Status::Unsupported;
  // 32-bit coordinates inside the kernel
  if (op.M > (int64_t(1) << 31) - 256 || op.N > (int64_t(1) << 30)) return Status::Unsupported;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return Status::LaunchFailed;
  const DeviceFacts facts = device_facts(device);
  if (facts.cc != 90) return Status::Unsupported;

  const int M = int(op.M), N = int(op.N), K = int(op.K);
  const Int8GemmEpilogue& e = op.epilogue;
  // Tile order: raster along N (CUTLASS's heuristic for M >> N: a wave of
  // persistent CTAs sweeps N for a few M tiles, reusing their A rows), and
  // when the weight does not sit comfortably in L2 (> 16 MB: Wan-14B's 26-70 MB
  // weights) in groups of 4 M-tiles, so each weight tile in flight serves 4
  // M-tiles. Measured on the H200 (swizzle 1/2/4/8): 4 is best or within 1%
  // on the 14B shapes (up to 7% faster than 1); the 1.3B shapes (2.4-13.8 MB
  // weights) are best at 1, and 8 costs them up to 70%. Overridable for
  // benchmarking (int8_gemm.h).
  const SchedulerTuning tuning = scheduler_tuning();
  const bool big_weight = op.N * op.K > (int64_t(16) << 20);
  const int swizzle = tuning.swizzle > 0 ? tuning.swizzle : (big_weight ? 4 : 1);
  using RasterOrderOptions = cutlass::gemm::kernel::detail::RasterOrderOptions;
  const RasterOrderOptions raster = tuning.raster == 'm'   ? RasterOrderOptions::AlongM
                                    : tuning.raster == 'n' ? RasterOrderOptions::AlongN
                                                           : RasterOrderOptions::Heuristic;

  // Calls without a residual run the lean instances (the same bits;
  // int8_gemm_post_scale_lean_sm90.cuh). Measured on the H200 (session 16):
  // plain 30-45% faster at K = 1536, the same within 2% at K >= 5120; bias +
  // GELU 1.8x faster at 1.3B ffn1 (0.77-0.91 against 1.57-1.66 ms), 7.99-9.83
  // against 8.72-9.78 ms at 14B ffn1 (noisy between calls).
  // TURBODIFF_GEMM_SM90_LEAN (read per call): 0 keeps every call on this
  // one; 1 returns the lean instances' status as it is, never falling back
  // (the GPU test's way to be sure they ran).
  const char* lean_env = std::getenv("TURBODIFF_GEMM_SM90_LEAN");
  const char lean_mode = lean_env && (lean_env[0] == '0' || lean_env[0] == '1') ? lean_env[0] : 'a';
  const bool gelu = e.activation == GemmActivation::GeluTanh;
  if (lean_mode != '0' && !e.residual && !e.gate) {
    const Status ls = gelu ? int8_gemm_post_scale_sm90_lean_gelu(args, facts.sm_count, swizzle, raster, stream)
                           : int8_gemm_post_scale_sm90_lean(args, facts.sm_count, swizzle, raster, stream);
    if (ls != Status::Unsupported || lean_mode == '1') return ls;
  }

  auto* out = static_cast<ElementOut*>(op.out);
  // Without a residual, C points at the output (a valid, aligned tensor of the
  // right shape) so the TMA descriptor is well formed; it is never loaded.
  const auto* c_ptr = e.residual ? reinterpret_cast<const ElementOut*>(e.residual) : out;
  const int64_t ld_c = e.residual ? e.ld_residual : op.ldo;

  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  const StrideA stride_a = make_stride(op.lda, _1{}, op.lda * op.M);
  const StrideB stride_b = make_stride(op.ldw, _1{}, op.ldw * op.N);
  const StrideC stride_c = make_stride(ld_c, _1{}, ld_c * op.M);
  const StrideD stride_d = make_stride(op.ldo, _1{}, op.ldo * op.M);

  typename Gemm::Arguments arguments{};
  arguments.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  arguments.problem_shape = {M, N, K, 1};
  arguments.mainloop = {op.a, stride_a, op.w, stride_b};
  arguments.epilogue.ptr_C = c_ptr;
  arguments.epilogue.dC = stride_c;
  arguments.epilogue.ptr_D = out;
  arguments.epilogue.dD = stride_d;
  arguments.epilogue.thread = {
      {},                                              // accumulator
      {args.a_scale, 0.f, {_1{}, _0{}, int64_t(0)}},   // a_scale[m]
      {args.w_scale, 0.f, {_0{}, _1{}, int64_t(0)}},   // w_scale[n]
      {e.bias, 0.f, {_0{}, _1{}, int64_t(0)}},         // bias[n] (null -> 0)
      {e.residual != nullptr},                         // residual
      {e.gate, e.ld_gate, int(e.gate ? e.rows_per_batch : 1)},
      {gelu ? 1 : 0, e.residual != nullptr ? 1 : 0},
  };
  arguments.hw_info.device_id = device;
  arguments.hw_info.sm_count = facts.sm_count;
  arguments.scheduler.max_swizzle_size = swizzle;
  arguments.scheduler.raster_order = raster;

  Gemm gemm;
  if (gemm.can_implement(arguments) != cutlass::Status::kSuccess) return Status::Unsupported;
  if (Gemm::get_workspace_size(arguments) != 0) return Status::Unsupported;  // the persistent scheduler needs none
  auto cu_stream = static_cast<cudaStream_t>(stream);
  if (gemm.initialize(arguments, nullptr, cu_stream) != cutlass::Status::kSuccess) return Status::LaunchFailed;
  if (gemm.run(cu_stream) != cutlass::Status::kSuccess) return Status::LaunchFailed;
  return cudaPeekAtLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed;
}

}  // namespace td::kernels
