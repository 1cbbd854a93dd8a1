// Tensor-level SageAttention-style quantized attention (`--attention sage`,
// and the sparse branch of `sagesla`) over kernels/sage_attention. The
// quantization contract and the LUT format: kernels/sage_attention/sage_attention.h.
//
// CUDA tensors (BF16): the sm_90a kernel on a Hopper GPU when this build has it,
// else the portable mma.sync kernel (sm_80+); the quantization workspace comes
// from the device memory pool; which backend ran is logged once per backend.
// Host tensors: sage_attention_cpu (the fp32 simulation of the same
// quantization, any float dtype; the LUT on the host).
#pragma once

#include <optional>
#include <string>

#include "core/tensor.h"
#include "kernels/sage_attention/sage_attention.h"

namespace td::ops {

struct SageAttentionOptions {
  kernels::SageBackend backend = kernels::SageBackend::Auto;
  std::optional<float> scale;  // default 1/sqrt(head_dim)
  // Block-sparse mode: lut int32 [B, H, QB, n_sel] on q's device (contiguous),
  // QB = ceil(Lq / block_q); undefined for dense.
  Tensor lut;
  int64_t block_q = 64, block_k = 128;
};

// q: [B, Lq, H, D]; k, v: [B, Lkv, H, D], any strides with head_dim contiguous.
// Returns a fresh dense [B, Lq, H, D] in out_dtype (default q's dtype). When
// `lse` is non-null it receives a fresh fp32 [B, H, Lq] (natural log, corrected
// for K smoothing).
Tensor sage_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SageAttentionOptions& options = {},
                      std::optional<DType> out_dtype = {}, Tensor* lse = nullptr);

// Which backend the last sage_attention() call on this thread used: "sm90",
// "portable" or "cpu".
const std::string& sage_attention_last_backend();

}  // namespace td::ops
