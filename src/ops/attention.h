// Tensor-level exact softmax attention (`--attention original`), no mask,
// over kernels/attention: the fp32 CPU reference for host tensors; for CUDA
// tensors (BF16) cuDNN's fused SDPA when this build has it and it takes the
// problem, else the portable flash kernel. When no CUDA backend takes a
// problem the error names each backend's reason.
#pragma once

#include <optional>
#include <string>

#include "core/tensor.h"

namespace td::ops {

// q: [B, Lq, H, D]; k, v: [B, Lkv, H, D]. Any strides with the last (channel)
// dim contiguous, so BLHD projections and BHLD views (ops::qk_norm_rope) both
// work. scale: softmax scale (default 1/sqrt(D)). Returns a fresh dense
// [B, Lq, H, D] tensor in out_dtype (default q's dtype).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<float> scale = {},
                 std::optional<DType> out_dtype = {});

// Which backend the last attention() call on this thread used on CUDA
// ("cudnn", "flash") or "cpu"; for tests and logs.
const std::string& attention_last_backend();

}  // namespace td::ops
