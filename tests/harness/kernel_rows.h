// Host row buffers for the row-wise kernel tests (norm, elementwise): a
// [rows, dim] matrix of one kernel element type with a row stride and an
// optional offset (a misaligned base), poisoned with NaN so padding a kernel
// must not touch stays detectable; fresh random fill; one-ulp bounds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "harness/harness.h"
#include "kernels/norm/norm_host.h"
#include "kernels/status.h"

namespace td::kernels::test_rows {

inline DType dtype_of(ElemType t) {
  return t == ElemType::F32 ? DType::F32 : t == ElemType::F16 ? DType::F16 : DType::BF16;
}
inline const char* type_name(ElemType t) { return t == ElemType::F32 ? "f32" : t == ElemType::F16 ? "f16" : "bf16"; }

// Host rows (as in the CPU tests), optionally starting `offset` elements into
// the buffer (a misaligned base for the GPU's scalar path).
struct Rows {
  ElemType type = ElemType::F32;
  int64_t rows = 0, dim = 0, stride = 0, offset = 0;
  std::vector<unsigned char> bytes;

  Rows(ElemType t, int64_t r, int64_t d, int64_t s, int64_t off = 0)
      : type(t), rows(r), dim(d), stride(s), offset(off),
        bytes(size_t(std::max<int64_t>(off + r * s, 1)) * elem_size(t)) {
    test::poison(bytes.data(), bytes.size(), dtype_of(t));
  }
  void* data() { return bytes.data() + offset * int64_t(elem_size(type)); }
  const void* data() const { return bytes.data() + offset * int64_t(elem_size(type)); }
  double at(int64_t r, int64_t i) const { return load_act(data(), type, r * stride + i); }
  std::vector<double> values() const {
    std::vector<double> v;
    v.reserve(size_t(rows * dim));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < dim; ++i) v.push_back(at(r, i));
    return v;
  }
  size_t padding_written() const {
    size_t n = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = dim; i < stride; ++i) n += !std::isnan(at(r, i));
    return n;
  }
};

inline Rows random_rows(ElemType t, int64_t rows, int64_t dim, int64_t stride, float mean, float stddev, int64_t off = 0) {
  Rows x(t, rows, dim, stride, off);
  const std::vector<float> v = test::randn(size_t(rows * dim), mean, stddev);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) store_act(x.data(), t, r * stride + i, v[size_t(r * dim + i)]);
  return x;
}


inline double ulp(ElemType t, double v) {
  const int precision = t == ElemType::F32 ? 24 : t == ElemType::F16 ? 11 : 8;
  const int min_exp = t == ElemType::F16 ? -14 : -126;
  int e = 0;
  std::frexp(std::fabs(v), &e);
  return std::ldexp(1.0, std::max(e - 1, min_exp) - (precision - 1));
}

}  // namespace td::kernels::test_rows
