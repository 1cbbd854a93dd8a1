// Tensor-level activations and broadcasting binary ops the Wan DiT needs.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace td::ops {

Tensor gelu_tanh(const Tensor& x, std::optional<DType> out_dtype = {});  // torch approximate='tanh'
Tensor silu(const Tensor& x, std::optional<DType> out_dtype = {});

// a (op) b where b is: a tensor of a's shape and dtype; an f32 vector [dim]
// (broadcast over rows: bias add); or f32 [batch, dim] rows (per-sample: the
// rows of a split evenly among the batch).
Tensor add(const Tensor& a, const Tensor& b, std::optional<DType> out_dtype = {});
Tensor mul(const Tensor& a, const Tensor& b, std::optional<DType> out_dtype = {});
// In place: a <- a (op) b.
void add_(Tensor& a, const Tensor& b);
void mul_(Tensor& a, const Tensor& b);

}  // namespace td::ops
