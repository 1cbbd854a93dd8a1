// W8A8 INT8 GEMM with fused epilogue: out[M, N] = epilogue(A[M, K] . W[N, K]^T)
// ("TN": both operands K-contiguous, the layout of a Linear's activations and
// weight). Two scale schemes, each with a CPU reference and CUDA kernels:
//
// Post-scale (the TurboT2AV variant): one int32 accumulation over all of K,
// scales applied once in the epilogue,
//   y[m, n] = float(sum_k qa[m, k] * qw[n, k]) * a_scale[m] * w_scale[n]
//   a_scale [M] fp32, one per token (quant_per_row.h on the activation)
//   w_scale [N] fp32, one per output channel (quant_per_row.h on the weight)
//
// Block-scaled (TurboDiffusion's format): int32 partial sums over each
// 128-deep K block kb, promoted to fp32 with both scales of that block,
//   y[m, n] = sum_kb float(sum_{k in kb} qa[m, k] * qw[n, k]) * sa(m, kb) * sw(n / 128, kb)
//   sw: w_scale[(n / 128) * ld_w_scale + kb], [ceil(N/128), ceil(K/128)] row-major
//       (TurboDiffusion's `*.scale`; quant_block128.h on the weight)
//   sa: ActScale::Token128 -> a_scale[kb * ld_a_scale + m] (quant_token128.h:
//       1x128 groups, K-block-major, ld_a_scale >= M)
//       ActScale::Block128 -> a_scale[(m / 128) * ld_a_scale + kb]
//       (quant_block128.h: 128x128 blocks, ld_a_scale >= ceil(K/128))
//   The last K block may be shorter than 128 (K need not be a multiple of 128).
//
// Epilogue (both schemes; all arithmetic in fp32, one rounding to the output):
//   y += bias[n]                               bias optional (fp32 [N])
//   y  = gelu_tanh(y)                          when activation == GeluTanh
//   y  = residual[m, n] + gate[b, n] * y       when residual is given (bf16),
//        b = m / rows_per_batch                gate optional (fp32, null = 1)
//   out[m, n] = y                              bf16 (F32 for the CPU reference too)
// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), PyTorch's
// approximate="tanh". out may alias residual exactly (same pointer and ld:
// Wan's in-place `x = x + gate * f(x)`); no other overlap is allowed.
//
// Kernels (all return Status, never throw, allocate or synchronize):
//   *_ref     CPU reference, any sizes, fp32 or fp64 accumulation of the scaled
//             partial sums (int32 products are exact either way), rows
//             [m_begin, m_end) only, so tests can check slices of huge shapes.
//   *_sm90    Hopper (sm_90a): TMA + wgmma, warp-specialized, persistent.
//   *_mma     portable (sm_80+: Ampere, Ada, Hopper, Blackwell): mma.sync
//             m16n8k32 s8, ldmatrix, cp.async multi-stage pipeline.
//
// Requirements of the CUDA kernels (Status::Unsupported otherwise, so the
// caller can fall back to a BF16 GEMM; Status::InvalidArgument for arguments
// that are wrong for every kernel, e.g. ld < K or null pointers):
//   K % 16 == 0 and 16 <= K <= 131072 (int32 accumulation of K products of
//     |q| <= 128 stays below 2^31); N % 8 == 0; M >= 1
//   a, w: 16-byte aligned, lda % 16 == 0, ldw % 16 == 0
//   out, residual: bf16, 16-byte aligned, ldo % 8 == 0, ld_residual % 8 == 0
//   a_scale, w_scale, bias, gate: 16-byte aligned; ld_gate % 4 == 0;
//     ld_a_scale and ld_w_scale: any (>= the minimum above)
//   out_type BF16 (the CPU reference also writes F32)
// The Wan shapes (K, N in {1536, 5120, 8960, 13824}, any M) meet all of them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

enum class GemmActivation : int { None = 0, GeluTanh = 1 };

struct Int8GemmEpilogue {
  const float* bias = nullptr;  // [N] fp32, or null
  GemmActivation activation = GemmActivation::None;
  const uint16_t* residual = nullptr;  // bf16 [M, ld_residual], or null (no residual add)
  int64_t ld_residual = 0;
  const float* gate = nullptr;  // fp32 [ceil(M / rows_per_batch), ld_gate]; null = 1 (plain residual add)
  int64_t ld_gate = 0;
  int64_t rows_per_batch = 0;  // rows (tokens) per sample, used with gate; >= 1 when gate is given
};

// Operands and output shared by both schemes.
struct Int8GemmOperands {
  int64_t M = 0, N = 0, K = 0;
  const int8_t* a = nullptr;  // [M, lda] row-major activations
  int64_t lda = 0;
  const int8_t* w = nullptr;  // [N, ldw] row-major weight
  int64_t ldw = 0;
  void* out = nullptr;  // [M, ldo] of out_type
  int64_t ldo = 0;
  ElemType out_type = ElemType::BF16;
  Int8GemmEpilogue epilogue;
};

struct Int8GemmPostScaleArgs {
  Int8GemmOperands op;
  const float* a_scale = nullptr;  // [M]
  const float* w_scale = nullptr;  // [N]
};

enum class ActScale : int {
  Token128 = 0,  // 1x128 groups: a_scale[kb * ld_a_scale + m]
  Block128 = 1,  // 128x128 blocks: a_scale[(m / 128) * ld_a_scale + kb]
};

struct Int8GemmBlockScaledArgs {
  Int8GemmOperands op;
  const float* a_scale = nullptr;
  ActScale a_scale_kind = ActScale::Token128;
  int64_t ld_a_scale = 0;
  const float* w_scale = nullptr;  // [ceil(N/128), ld_w_scale], ld_w_scale >= ceil(K/128)
  int64_t ld_w_scale = 0;
};

// Accumulation precision of the CPU reference's fp part (promotion + epilogue).
enum class RefPrecision : int { F32 = 0, F64 = 1 };

// ---- argument checks (what every implementation accepts) -------------------
// InvalidArgument for missing pointers, negative sizes, ld < width, a gate
// without rows_per_batch, an out_type other than F32/BF16. Ok otherwise.
Status int8_gemm_post_scale_check(const Int8GemmPostScaleArgs& args);
Status int8_gemm_block_scaled_check(const Int8GemmBlockScaledArgs& args);
// The CUDA kernels' additional shape/alignment requirements (see above):
// Ok, or Unsupported naming nothing (the ops layer says which rule failed by
// calling int8_gemm_cuda_unsupported_reason).
Status int8_gemm_cuda_supported(const Int8GemmOperands& op, const void* a_scale, const void* w_scale);
// A short human-readable reason why int8_gemm_cuda_supported is not Ok
// (static string), or "" when it is.
const char* int8_gemm_cuda_unsupported_reason(const Int8GemmOperands& op, const void* a_scale,
                                              const void* w_scale);

// ---- CPU references ---------------------------------------------------------
// Writes rows [m_begin, m_end) of out (m_end < 0: M), rows split over td::parallel_for.
Status int8_gemm_post_scale_ref(const Int8GemmPostScaleArgs& args, RefPrecision precision = RefPrecision::F32,
                                int64_t m_begin = 0, int64_t m_end = -1);
Status int8_gemm_block_scaled_ref(const Int8GemmBlockScaledArgs& args, RefPrecision precision = RefPrecision::F32,
                                  int64_t m_begin = 0, int64_t m_end = -1);

// ---- CUDA kernels -----------------------------------------------------------
// `stream` is a cudaStream_t. Device pointers. Asynchronous.
#if TURBODIFF_HAVE_CUDA || defined(__CUDACC__)
// Portable mma.sync kernels (every arch in the build list >= sm_80).
Status int8_gemm_post_scale_mma(const Int8GemmPostScaleArgs& args, void* stream);
Status int8_gemm_block_scaled_mma(const Int8GemmBlockScaledArgs& args, void* stream);
#endif

#if TURBODIFF_HAVE_SM90 || defined(__CUDACC__)
// Hopper kernels; present only when the build includes sm_90a
// (TURBODIFF_HAVE_SM90), and Unsupported on any GPU other than cc 9.0.
// The post-scale kernel is a CUTLASS 3.x warp-specialized ping-pong GEMM
// (128x128x128 tiles) with a custom epilogue visitor tree; it needs no
// workspace. Calls without a residual run a second instance whose tree has
// only the scale, bias and (compile-time) GELU leaves
// (int8_gemm_post_scale_lean_sm90.cuh): the same bits, 30-45% faster at
// K = 1536; TURBODIFF_GEMM_SM90_LEAN=0 keeps them on the full one (=1: the
// lean ones' status returned as it is, no fallback). The persistent tile
// order of both (raster along N, 4-tile M groups when
// the weight exceeds 16 MB) can be overridden for benchmarking with the environment
// variables TURBODIFF_GEMM_SM90_SWIZZLE=1|2|4|8 and TURBODIFF_GEMM_SM90_RASTER=m|n
// (read once per process). The block-scaled kernel is our own (128x128x128
// tiles, two consumer warpgroups promoting every K block).
Status int8_gemm_post_scale_sm90(const Int8GemmPostScaleArgs& args, void* stream);
Status int8_gemm_block_scaled_sm90(const Int8GemmBlockScaledArgs& args, void* stream);
#endif

}  // namespace td::kernels
