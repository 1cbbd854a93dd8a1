// fp32 CPU reference of residual_gate_norm (see residual_gate_norm.h): per
// row, x_new = round_res(x + gate * y) (product rounded, then the sum, in
// fp32), written to x_out, then a LayerNorm of the rounded x_new (two-pass
// statistics), optional affine and optional modulation, rounded to out's type.
// Each row is buffered before any write, so x_out == x and out == y are safe.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/norm/norm_host.h"
#include "kernels/norm/residual_gate_norm.h"
#include "kernels/quant/quant_token128.h"

namespace td::kernels {

Status residual_gate_norm_check(const ResidualGateNormParams& p) {
  if (!valid_shape(p.rows, p.dim) || !(p.eps >= 0.f) || !std::isfinite(p.eps)) return Status::InvalidArgument;
  if (p.residual_type != ElemType::F32 && p.residual_type != ElemType::BF16) return Status::InvalidArgument;
  if (!valid_rows_operand(p.x, p.residual_type, p.x_stride, p.rows, p.dim) ||
      !valid_rows_operand(p.x_out, p.residual_type, p.x_out_stride, p.rows, p.dim) ||
      !valid_rows_operand(p.y, p.y_type, p.y_stride, p.rows, p.dim) ||
      ((p.out || !p.codes) && !valid_rows_operand(p.out, p.out_type, p.out_stride, p.rows, p.dim)))
    return Status::InvalidArgument;
  // the optional token128 codes: codes [rows, dim], scales [ceil(dim / 128), ld_scales >= rows]
  if (p.codes && (!p.code_scales || p.codes_stride < p.dim || p.ld_scales < p.rows)) return Status::InvalidArgument;
  if (!p.codes && p.code_scales) return Status::InvalidArgument;
  if (!valid_per_sample_rows(p.mod_stride, p.rows_per_batch, p.dim)) return Status::InvalidArgument;
  // Allowed exact aliases: x_out == x, out == y. Everything else must be distinct.
  if (!alias_ok(p.x, p.residual_type, p.x_stride, p.x_out, p.residual_type, p.x_out_stride) ||
      !alias_ok(p.y, p.y_type, p.y_stride, p.out, p.out_type, p.out_stride))
    return Status::InvalidArgument;
  if (p.rows > 0 && ((p.out && (p.out == p.x || p.out == p.x_out)) || p.x_out == p.y || p.x == p.y))
    return Status::InvalidArgument;
  return Status::Ok;
}

Status residual_gate_norm_cpu(const ResidualGateNormParams& p_in) {
  if (Status s = residual_gate_norm_check(p_in); s != Status::Ok) return s;
  // With codes and no out: out into a scratch buffer, then quantized from it
  // (the token128 quantizer's own reference, so the codes equal the unfused
  // sequence's by construction).
  ResidualGateNormParams p = p_in;
  std::vector<unsigned char> scratch;
  if (p.codes && !p.out) {
    scratch.resize(size_t(p.rows * p.dim) * elem_size(p.out_type));
    p.out = scratch.data();
    p.out_stride = p.dim;
  }
  const int64_t dim = p.dim;
  parallel_for(p.rows, std::max<int64_t>(1, 65536 / dim), [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(dim));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t mod_row = (r / p.rows_per_batch) * p.mod_stride;
      double sum = 0;
      for (int64_t i = 0; i < dim; ++i) {
        const float x = load_act(p.x, p.residual_type, r * p.x_stride + i);
        const float y = load_act(p.y, p.y_type, r * p.y_stride + i);
        const float added = p.gate ? p.gate[mod_row + i] * y : y;
        row[size_t(i)] = round_to_act(p.residual_type, x + added);
        sum += row[size_t(i)];
      }
      const RowStats st = layer_norm_row_stats(row.data(), dim, sum, p.eps);
      const float mean_f = st.mean, rstd = st.rstd;
      for (int64_t i = 0; i < dim; ++i) {
        store_act(p.x_out, p.residual_type, r * p.x_out_stride + i, row[size_t(i)]);
        float v = (row[size_t(i)] - mean_f) * rstd;
        if (p.weight) v *= p.weight[i];
        if (p.bias) v += p.bias[i];
        if (p.scale) v *= 1.f + p.scale[mod_row + i];
        if (p.shift) v += p.shift[mod_row + i];
        store_act(p.out, p.out_type, r * p.out_stride + i, v);
      }
    }
  });
  if (p.codes)
    return quantize_token128_cpu(p.out_type, p.out, p.rows, p.dim, p.out_stride, p.codes, p.codes_stride,
                                 p.code_scales, p.ld_scales);
  return Status::Ok;
}

}  // namespace td::kernels
