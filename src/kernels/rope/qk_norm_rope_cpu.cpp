// fp32 CPU reference of the fused q/k RMSNorm (over the full dim) + 3-D RoPE.
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/quant/quant_ref.h"
#include "kernels/rope/qk_norm_rope.h"

namespace td::kernels {
namespace {

bool out_type_ok(ElemType t) { return t == ElemType::F32 || t == ElemType::F16 || t == ElemType::BF16; }

void store_out(ElemType t, void* out, int64_t i, float v) {
  switch (t) {
    case ElemType::F32: static_cast<float*>(out)[i] = v; return;
    case ElemType::F16: static_cast<uint16_t*>(out)[i] = td::f32_to_f16(v); return;
    default: static_cast<uint16_t*>(out)[i] = td::f32_to_bf16(v); return;
  }
}

struct RowGeometry {
  int64_t L, plane;  // tokens per sample, height * width
  int64_t width;
  int heads, head_dim;
};

// Normalizes and rotates row r of one tensor into out.
template <typename Load>
void norm_rope_row(Load load, const void* in, int64_t ld_in, const float* weight, float eps, const float* tables,
                   const RopeTableLayout& tl, const RowGeometry& g, RopeOutLayout layout, ElemType out_type,
                   void* out, int64_t r, float* y) {
  const int64_t dim = int64_t(g.heads) * g.head_dim;
  double sq = 0;
  for (int64_t c = 0; c < dim; ++c) {
    const double v = load(in, r * ld_in + c);
    sq += v * v;
  }
  const float rstd = float(1.0 / std::sqrt(sq / double(dim) + double(eps)));
  for (int64_t c = 0; c < dim; ++c) y[c] = load(in, r * ld_in + c) * rstd * weight[c];

  const int64_t b = r / g.L, l = r % g.L;
  const int64_t pos[3] = {l / g.plane, (l / g.width) % (g.plane / g.width), l % g.width};
  const int pairs[3] = {tl.pairs_t, tl.pairs_h, tl.pairs_w};
  const float* cos_tab[3] = {tables + tl.cos_t, tables + tl.cos_h, tables + tl.cos_w};
  const float* sin_tab[3] = {tables + tl.sin_t, tables + tl.sin_h, tables + tl.sin_w};
  for (int h = 0; h < g.heads; ++h) {
    float* head = y + int64_t(h) * g.head_dim;
    int p = 0;  // pair index within the head
    for (int axis = 0; axis < 3; ++axis) {
      for (int j = 0; j < pairs[axis]; ++j, ++p) {
        const float c = cos_tab[axis][pos[axis] * pairs[axis] + j];
        const float s = sin_tab[axis][pos[axis] * pairs[axis] + j];
        const float re = head[2 * p], im = head[2 * p + 1];
        head[2 * p] = re * c - im * s;
        head[2 * p + 1] = re * s + im * c;
      }
    }
    const int64_t out_base = layout == RopeOutLayout::BLHD ? r * dim + int64_t(h) * g.head_dim
                                                           : ((b * g.heads + h) * g.L + l) * g.head_dim;
    for (int c = 0; c < g.head_dim; ++c) store_out(out_type, out, out_base + c, head[c]);
  }
}

}  // namespace

Status qk_norm_rope_cpu(ElemType in_type, const void* q_in, int64_t ld_q_in, const void* k_in, int64_t ld_k_in,
                        const float* q_weight, const float* k_weight, int64_t batch, int64_t frames, int64_t height,
                        int64_t width, int heads, int head_dim, float eps, const float* rope_tables,
                        RopeOutLayout layout, ElemType out_type, void* q_out, void* k_out) {
  if (batch < 0 || frames < 1 || height < 1 || width < 1 || heads < 1 || head_dim < 2 || head_dim % 2 != 0 ||
      !(eps >= 0.f) || !out_type_ok(out_type))
    return Status::InvalidArgument;
  const int64_t dim = int64_t(heads) * head_dim;
  const RowGeometry g{frames * height * width, height * width, width, heads, head_dim};
  const int64_t rows = batch * g.L;
  if (rows == 0) return Status::Ok;
  if (!q_in || !k_in || !q_weight || !k_weight || !rope_tables || !q_out || !k_out || ld_q_in < dim || ld_k_in < dim)
    return Status::InvalidArgument;
  const RopeTableLayout tl = rope_table_layout(head_dim, frames, height, width);
  return ref::with_loader(in_type, [&](auto load) {
    // Items [0, rows) are q's rows, [rows, 2 rows) k's.
    td::parallel_for(2 * rows, 16, [&](int64_t i0, int64_t i1) {
      std::vector<float> y(static_cast<size_t>(dim));
      for (int64_t i = i0; i < i1; ++i) {
        const bool is_q = i < rows;
        norm_rope_row(load, is_q ? q_in : k_in, is_q ? ld_q_in : ld_k_in, is_q ? q_weight : k_weight, eps,
                      rope_tables, tl, g, layout, out_type, is_q ? q_out : k_out, is_q ? i : i - rows, y.data());
      }
    });
    return Status::Ok;
  });
}

}  // namespace td::kernels
