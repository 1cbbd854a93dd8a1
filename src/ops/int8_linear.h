// Tensor-level W8A8 linear: y[..., N] = x[..., K] . W[N, K]^T (+ bias) (then
// optionally GELU-tanh), W held as INT8 codes with fp32 scales, x quantized
// to INT8 on the fly. All dispatch between kernels happens here:
//
//   host tensors   the CPU reference GEMM (kernels/gemm/int8_gemm_ref.cpp) after
//                  the CPU quantizer of the activation, fp32 promotion.
//   CUDA tensors   the activation quantizer, then the sm_90a kernel on a cc 9.0
//                  GPU in a build with sm_90a, else the portable mma.sync kernel.
//                  cuBLAS BF16 (ops::linear on the weight dequantized on the
//                  fly) instead when M < kInt8LinearMinRowsCuda, or when the
//                  INT8 kernels return Unsupported for the shape/alignment;
//                  each fallback reason is logged once per process.
//
// Weight formats (Int8WeightScheme):
//   PerChannel  scale f32 [N]: one per output channel (the post-scale GEMM;
//               the activation gets one scale per token).
//   Block128    scale f32 [ceil(N/128), ceil(K/128)]: TurboDiffusion's format
//               (the block-scaled GEMM); the activation gets 1x128 token groups
//               (ActScale::Token128) or TurboDiffusion's 128x128 blocks.
#pragma once

#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace td::ops {

enum class Int8WeightScheme { PerChannel, Block128 };
// How the activation is quantized (must fit the weight scheme: PerToken with
// PerChannel, Token128 or Block128 with Block128).
enum class Int8ActScheme { PerToken, Token128, Block128 };

const char* int8_act_scheme_name(Int8ActScheme s);

// Below this many rows (tokens) the INT8 path on CUDA is slower than cuBLAS
// BF16: docs/benchmarks.md measured M = 512 at 0.54-0.83x of BF16 for every
// Wan shape and every INT8 kernel (activation quantization included), and
// M = 32760 / 75600 faster for the post-scale kernel. The crossover between
// 512 and 32760 was not measured; 2048 keeps Wan's text context (k/v of the
// cross-attention, M = B * 512) and other small-M calls on cuBLAS while every
// video-token GEMM (M >= 32760 at 480p) takes the INT8 kernels.
inline constexpr int64_t kInt8LinearMinRowsCuda = 2048;

struct Int8LinearWeight {
  Tensor q;      // i8 [N, K], rows contiguous along K (K-contiguous, ld = K)
  Tensor scale;  // f32: [N] (PerChannel) or [ceil(N/128), ceil(K/128)] (Block128), contiguous
  Int8WeightScheme scheme = Int8WeightScheme::Block128;
  int64_t out_features() const { return q.size(0); }
  int64_t in_features() const { return q.size(1); }
};

// Checks shapes/dtypes of a weight (names `what` in the error).
void check_int8_weight(const Int8LinearWeight& w, const char* what);

// The weight back in floating point (w = q * scale), on the weight's device, in
// `dtype` (F32 or BF16; F16 works too on the host). Used by the cuBLAS fallback
// and by tests.
Tensor dequantize_int8_weight(const Int8LinearWeight& w, DType dtype);

// x: [..., K] (F32/BF16/F16; last dim contiguous, leading dims collapsible),
// bias: undefined or contiguous f32 [N]. Returns a fresh contiguous [..., N]
// tensor in out_dtype (default x's dtype; F32/BF16 on the host, BF16 on CUDA
// unless the fallback runs, which honours any float dtype).
// gelu_tanh: apply PyTorch's gelu(approximate="tanh") after the bias.
Tensor int8_linear(const Tensor& x, const Int8LinearWeight& weight, const Tensor& bias, Int8ActScheme act,
                   std::optional<DType> out_dtype = {}, bool gelu_tanh = false);

// An activation quantized once for several INT8 linears that read the same x
// (Wan's q, k and v projections): x itself (kept for the cuBLAS fallback and
// the output shape), and, where int8_linear would run an INT8 kernel for x
// (always on the host; on CUDA when M >= kInt8LinearMinRowsCuda and x is
// 16-bit), its codes and scales in `act`'s layout. `codes` undefined: every
// int8_linear on it takes the fallback.
struct QuantizedActivation {
  Tensor x;
  Int8ActScheme act = Int8ActScheme::Token128;
  Tensor codes;  // i8 [M, K]
  Tensor scale;  // f32, the layout of `act` (int8_linear.cpp)
  int64_t ld_scale = 0;
  // false: x gives only the shape and dtype (a fused norm + quantize wrote
  // the codes and never x); an int8_linear that would need x itself (the
  // cuBLAS fallback) fails with an Internal error instead of reading it.
  bool x_written = true;
};
QuantizedActivation quantize_activation(const Tensor& x, Int8ActScheme act);

// The codes and scales quantize_activation(x, act) would make, allocated and
// not written (codes undefined where int8_linear would not run an INT8
// kernel on x): for a producer that quantizes x itself
// (residual_gate_norm_quantized).
QuantizedActivation quantized_activation_buffers(const Tensor& x, Int8ActScheme act);

// int8_linear on an activation quantized by quantize_activation: the same
// result as int8_linear(a.x, ..., a.act, ...), bit for bit.
Tensor int8_linear(const QuantizedActivation& a, const Int8LinearWeight& weight, const Tensor& bias,
                   std::optional<DType> out_dtype = {}, bool gelu_tanh = false);

}  // namespace td::ops
