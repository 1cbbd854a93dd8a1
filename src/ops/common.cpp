#include "ops/common.h"

namespace td::ops {

kernels::ElemType elem_type(DType t, const char* op, const char* what) {
  switch (t) {
    case DType::F32: return kernels::ElemType::F32;
    case DType::F16: return kernels::ElemType::F16;
    case DType::BF16: return kernels::ElemType::BF16;
    case DType::I8: return kernels::ElemType::I8;
    case DType::F8E4M3: return kernels::ElemType::F8E4M3;
    default: fail(ErrorKind::DType, op, ": ", what, " has dtype ", dtype_name(t), ", which no kernel of this op takes");
  }
}

void check_status(kernels::Status s, const char* op, const std::string& context) {
  if (s == kernels::Status::Ok) return;
  const ErrorKind k = s == kernels::Status::LaunchFailed ? ErrorKind::Cuda
                      : s == kernels::Status::Unsupported ? ErrorKind::Unsupported
                                                          : ErrorKind::Shape;
  fail(k, op, ": ", kernels::status_str(s), " (", context, ")");
}

Rows as_rows(const Tensor& x, const char* op, const char* what) {
  TD_CHECK(x.defined(), Internal, op, ": ", what, " is undefined");
  TD_CHECK(x.dim() >= 1, Shape, op, ": ", what, " must have at least one dimension, got ", x.desc());
  const auto& sh = x.shape();
  const auto& st = x.strides();
  const int64_t d = x.dim();
  TD_CHECK(sh[size_t(d - 1)] == 1 || st[size_t(d - 1)] == 1, Shape, op, ": the last dimension of ", what, " (",
           x.desc(), ") must be contiguous, stride is ", st[size_t(d - 1)]);
  Rows r;
  r.ptr = x.raw_data();
  r.dim = sh[size_t(d - 1)];
  r.rows = d == 1 ? 1 : x.numel() / std::max<int64_t>(r.dim, 1);
  r.stride = d == 1 ? r.dim : st[size_t(d - 2)];
  // leading dims must collapse: stride[i] == stride[i+1] * shape[i+1]
  for (int64_t i = 0; i + 2 < d; ++i)
    TD_CHECK(sh[size_t(i)] == 1 || st[size_t(i)] == st[size_t(i + 1)] * sh[size_t(i + 1)], Shape, op, ": ", what,
             " (", x.desc(), ", strides ", shape_str(st), ") cannot be viewed as rows of one stride");
  return r;
}

ModRows as_mod_rows(const Tensor& m, int64_t dim, const char* op, const char* what) {
  TD_CHECK(m.dtype() == DType::F32, DType, op, ": ", what, " must be f32, got ", m.desc());
  const Rows r = as_rows(m, op, what);
  TD_CHECK(r.dim == dim, Shape, op, ": ", what, " has ", r.dim, " channels (", m.desc(), "), expected ", dim);
  return {static_cast<const float*>(r.ptr), r.rows, r.stride};
}

void check_same_device(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  const Tensor* first = nullptr;
  const char* first_name = "";
  for (const auto& [name, t] : ts) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      first_name = name;
      continue;
    }
    TD_CHECK(t->device() == first->device(), Usage, op, ": ", name, " is on ", t->device().str(), " but ",
             first_name, " is on ", first->device().str());
  }
}

void check_attention_operand(const Tensor& t, const char* op, const char* what) {
  TD_CHECK(t.defined() && t.dim() == 4, Shape, op, ": ", what, " must be 4-D [B, L, heads, head_dim], got ",
           t.defined() ? t.desc() : std::string("undefined"));
  TD_CHECK(t.size(3) == 1 || t.strides()[3] == 1, Shape, op, ": ", what, " ", t.desc(),
           " must be contiguous along head_dim");
  for (int64_t d = 0; d < 3; ++d)
    TD_CHECK(t.strides()[size_t(d)] >= 0, Shape, op, ": ", what, " ", t.desc(), " has a negative stride");
}

kernels::AttnStrides attention_strides(const Tensor& t) {
  const auto& s = t.strides();
  return {s[0], s[2], s[1]};  // logical [B, L, H, D] -> (batch, head, token)
}

}  // namespace td::ops
