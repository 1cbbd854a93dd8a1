// Tensor-level T5 / umT5 attention core (kernels/t5_attention): softmax(q k^T
// + relative-position bias, padded keys excluded) v, without 1/sqrt(d)
// scaling. Host tensors run the fp32 reference (inputs widened to fp32);
// CUDA tensors run the CUDA kernel.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"

namespace td::ops {

// q, k, v: [B, L, H, D], one dtype (f32, bf16 or f16), contiguous, on one device.
// bias_table: f32 [num_buckets, H] on that device (a layer's relative_attention_bias).
// rel_bucket: 2L - 1 buckets, rel_bucket[rel + L - 1] for rel = key - query.
// key_mask: host i64 [B, L], 0 = padding key; every sample needs a token.
// Returns a fresh [B, L, H, D] tensor in out_dtype (default q's dtype) on q's device.
Tensor t5_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias_table,
                    const std::vector<int32_t>& rel_bucket, const Tensor& key_mask,
                    std::optional<DType> out_dtype = {});

}  // namespace td::ops
