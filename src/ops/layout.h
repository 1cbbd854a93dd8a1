// Tensor-level layout ops of the Wan DiT: patchify before the patch embedding
// and unpatchify after the head, on the tensors' device (kernels/layout).
// Also the standalone 3-D RoPE of the unfused (`--default-norm`) path.
#pragma once

#include <optional>

#include "core/tensor.h"
#include "ops/rope.h"

namespace td::ops {

// latent f32 [B, C, T, H, W] (any layout: made contiguous first) -> tokens
// [B, L, C*pt*ph*pw] in out_dtype (F32 or BF16), features in (c, kt, kh, kw)
// order; on the latent's device.
Tensor patchify(const Tensor& latent, int64_t pt, int64_t ph, int64_t pw, DType out_dtype = DType::F32);

// tokens f32 [B, L, pt*ph*pw*C] in (kt, kh, kw, c) order -> f32 [B, C, T, H, W].
Tensor unpatchify(const Tensor& tokens, int64_t frames, int64_t height, int64_t width, int64_t pt, int64_t ph,
                  int64_t pw);

// x: [B, L, heads * head_dim] (last dim contiguous; L = grid.tokens()),
// tables: rope_tables(head_dim, grid, x's device). Returns [B, L, heads,
// head_dim] dense in out_dtype (default x's dtype) with each head rotated by
// Wan's 3-D RoPE (kernels/rope/rope_apply.h).
Tensor rope_apply(const Tensor& x, const Tensor& tables, const PatchGrid& grid, int64_t heads,
                  std::optional<DType> out_dtype = {});

}  // namespace td::ops
