// Helpers shared by the Tensor-level ops: dtype mapping to kernel element
// types, turning a kernel Status into a td::Error, and viewing a tensor as
// [rows, dim] with a row stride (what the row-wise kernels take).
#pragma once

#include <optional>
#include <string>

#include "core/tensor.h"
#include "kernels/attention/attention.h"
#include "kernels/status.h"

namespace td::ops {

kernels::ElemType elem_type(DType t, const char* op, const char* what);

// Throws td::Error naming the op when a kernel did not return Ok.
void check_status(kernels::Status s, const char* op, const std::string& context);

struct Rows {
  void* ptr = nullptr;
  int64_t rows = 0, dim = 0, stride = 0;
};
// x viewed as [rows, dim = last dim]: the last dim must be contiguous and the
// leading dims must collapse into one stride. Names `what` in errors.
Rows as_rows(const Tensor& x, const char* op, const char* what);

// A per-sample fp32 modulation vector set [batch, dim] (a row stride is fine,
// e.g. one of the six rows of Wan's [B, 6, D] modulation).
struct ModRows {
  const float* ptr = nullptr;
  int64_t batch = 0, stride = 0;
};
ModRows as_mod_rows(const Tensor& m, int64_t dim, const char* op, const char* what);

// Same device for all defined tensors; names the op and the offending tensor.
void check_same_device(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts);

// Attention operands are [B, L, heads, head_dim] views (BLHD or BHLD memory):
// 4-D, head_dim contiguous, no negative stride; errors name `op` and `what`.
void check_attention_operand(const Tensor& t, const char* op, const char* what);
// The (batch, head, token) strides the attention kernels take, of such a view.
kernels::AttnStrides attention_strides(const Tensor& t);

}  // namespace td::ops
