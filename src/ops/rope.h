// Tensor-level Wan self-attention q/k epilogue: RMSNorm over the full model
// dimension, then 3-D RoPE per head (kernels/rope), for q and k together.
#pragma once

#include <optional>

#include "core/tensor.h"
#include "kernels/rope/qk_norm_rope.h"

namespace td::ops {

// The latent patch grid the tokens of one sample come from: frames x height x
// width patches (Wan: T x H/2 x W/2), tokens in (f, h, w) row-major order.
struct PatchGrid {
  int64_t frames = 0, height = 0, width = 0;
  int64_t tokens() const { return frames * height * width; }
};

// The cos/sin tables (kernels/rope/rope_tables.h) for head_dim and a grid, as
// an f32 vector on `device` (built on the host in fp64, then copied).
Tensor rope_tables(int64_t head_dim, const PatchGrid& grid, Device device, double theta = 10000.0);

struct QK {
  Tensor q, k;
};

// q, k: [B, L, heads * head_dim] (each with its own row stride; L =
// grid.tokens()). weights: f32 [heads * head_dim]. tables: rope_tables(...)
// for this head_dim and grid, on the same device. Returns q and k as
// [B, L, heads, head_dim] tensors in out_dtype (default q's dtype): dense for
// BLHD; for BHLD the memory is [B, heads, L, head_dim] and the returned
// tensors are permuted views of it (what ops::attention takes either way).
QK qk_norm_rope(const Tensor& q, const Tensor& k, const Tensor& q_weight, const Tensor& k_weight,
                const Tensor& tables, const PatchGrid& grid, int64_t heads, float eps,
                kernels::RopeOutLayout layout = kernels::RopeOutLayout::BLHD,
                std::optional<DType> out_dtype = {});

}  // namespace td::ops
