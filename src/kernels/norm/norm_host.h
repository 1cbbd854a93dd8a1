// Host-side helpers shared by the norm and elementwise kernels: element access
// for the CPU references (and the tests), and the argument checks every entry
// point runs before touching memory, so the CPU and CUDA versions of an op
// accept and reject exactly the same calls.
//
// Conventions of the row kernels: an activation tensor is `rows` rows of `dim`
// elements, row r starting `r * stride` elements after the base pointer
// (stride >= dim). Activations are F32, F16 or BF16; parameter vectors
// (weights, biases, modulation rows, gates) are always fp32.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "kernels/status.h"

namespace td::kernels {

// Activation element types the norm and elementwise kernels accept.
inline bool is_activation_type(ElemType t) {
  return t == ElemType::F32 || t == ElemType::F16 || t == ElemType::BF16;
}

inline size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::F32: return 4;
    case ElemType::F16:
    case ElemType::BF16: return 2;
    case ElemType::I8:
    case ElemType::F8E4M3: return 1;
  }
  return 0;
}

// Element i of an activation buffer, as float (exact for all three types).
inline float load_act(const void* base, ElemType t, int64_t i) {
  const auto* b = static_cast<const unsigned char*>(base);
  if (t == ElemType::F32) {
    float v;
    std::memcpy(&v, b + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, b + 2 * i, 2);
  return t == ElemType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// Writes v, rounded to nearest even (as the GPU's cvt.rn does), as element i.
inline void store_act(void* base, ElemType t, int64_t i, float v) {
  auto* b = static_cast<unsigned char*>(base);
  if (t == ElemType::F32) {
    std::memcpy(b + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = t == ElemType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
  std::memcpy(b + 2 * i, &h, 2);
}

// v rounded to the precision of t (what storing and re-loading it gives).
inline float round_to_act(ElemType t, float v) {
  if (t == ElemType::F32) return v;
  return t == ElemType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v));
}

// ---- argument checks ---------------------------------------------------------

// Checks one activation operand of a [rows, dim] op: a known activation type,
// a non-null pointer and stride >= dim. rows == 0 accepts anything.
inline bool valid_rows_operand(const void* p, ElemType t, int64_t stride, int64_t rows, int64_t dim) {
  if (!is_activation_type(t)) return false;
  if (rows == 0) return true;
  return p != nullptr && stride >= dim;
}

// Checks a [batch, dim] fp32 per-sample operand (modulation rows, gates):
// rows r of the activation use row r / rows_per_batch of it, `mod_stride`
// elements apart (mod_stride 0 is allowed: every sample shares one row).
inline bool valid_per_sample_rows(int64_t mod_stride, int64_t rows_per_batch, int64_t dim) {
  return rows_per_batch >= 1 && (mod_stride == 0 || mod_stride >= dim);
}

// Two operands may only overlap exactly: the same base, element type and
// stride (an in-place op). Any other sharing of a base pointer is rejected;
// overlaps that do not share a base pointer are the caller's responsibility.
inline bool alias_ok(const void* a, ElemType at, int64_t as, const void* b, ElemType bt, int64_t bs) {
  if (a == nullptr || a != b) return true;
  return at == bt && as == bs;
}

// The common shape checks: rows >= 0 and 1 <= dim <= 2^31 - 1 (kernels index
// columns with 32-bit integers).
inline bool valid_shape(int64_t rows, int64_t dim) { return rows >= 0 && dim >= 1 && dim <= INT32_MAX; }

// LayerNorm statistics of one row for the CPU references: the mean, then the
// biased variance about it (exact two-pass), both accumulated in double.
// `row_sum` is the sum of row[0..dim) the caller accumulated while loading.
struct RowStats {
  float mean, rstd;
};
inline RowStats layer_norm_row_stats(const float* row, int64_t dim, double row_sum, float eps) {
  const double mean = row_sum / double(dim);
  double sum_dev2 = 0;
  for (int64_t i = 0; i < dim; ++i) sum_dev2 += (row[i] - mean) * (row[i] - mean);
  return {float(mean), float(1.0 / std::sqrt(sum_dev2 / double(dim) + double(eps)))};
}

}  // namespace td::kernels
