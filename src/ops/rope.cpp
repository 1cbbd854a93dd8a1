#include "ops/rope.h"

#include "core/cuda_runtime.h"
#include "kernels/rope/rope_tables.h"
#include "ops/common.h"

namespace td::ops {

Tensor rope_tables(int64_t head_dim, const PatchGrid& g, Device device, double theta) {
  static const char* op = "rope_tables";
  TD_CHECK(head_dim >= 2 && head_dim % 2 == 0 && head_dim <= 1 << 16, Shape, op, ": head_dim must be even and >= 2, got ",
           head_dim);
  TD_CHECK(g.frames >= 1 && g.height >= 1 && g.width >= 1, Shape, op, ": the patch grid must be at least 1x1x1, got ",
           g.frames, "x", g.height, "x", g.width);
  const auto layout = kernels::rope_table_layout(int(head_dim), g.frames, g.height, g.width);
  Tensor host = Tensor::empty({layout.total}, DType::F32);
  check_status(kernels::rope_tables_cpu(int(head_dim), g.frames, g.height, g.width, theta, host.data<float>()), op,
               cat("head_dim ", head_dim, ", grid ", g.frames, "x", g.height, "x", g.width));
  return device.is_cpu() ? host : host.to(device);
}

QK qk_norm_rope(const Tensor& q, const Tensor& k, const Tensor& q_weight, const Tensor& k_weight,
                const Tensor& tables, const PatchGrid& g, int64_t heads, float eps, kernels::RopeOutLayout layout,
                std::optional<DType> out_dtype) {
  static const char* op = "qk_norm_rope";
  check_same_device(op, {{"q", &q}, {"k", &k}, {"q_weight", &q_weight}, {"k_weight", &k_weight}, {"tables", &tables}});
  TD_CHECK(q.dim() == 3 && k.shape() == q.shape(), Shape, op, ": q and k must both be [B, L, dim], got ", q.desc(),
           " and ", k.desc());
  TD_CHECK(q.dtype() == k.dtype(), DType, op, ": q ", q.desc(), " and k ", k.desc(), " differ in dtype");
  const int64_t B = q.size(0), L = q.size(1), dim = q.size(2);
  TD_CHECK(L == g.tokens(), Shape, op, ": q has ", L, " tokens but the patch grid ", g.frames, "x", g.height, "x",
           g.width, " has ", g.tokens());
  TD_CHECK(heads >= 1 && dim % heads == 0 && (dim / heads) % 2 == 0, Shape, op, ": dim ", dim,
           " must split into ", heads, " heads of an even size");
  const int64_t head_dim = dim / heads;
  const Rows rq = as_rows(q, op, "q"), rk = as_rows(k, op, "k");
  for (const auto& [w, what] : {std::pair{&q_weight, "q_weight"}, std::pair{&k_weight, "k_weight"}})
    TD_CHECK(w->defined() && w->dtype() == DType::F32 && w->numel() == dim && w->is_contiguous(), Shape, op, ": ",
             what, " must be a contiguous f32 vector of ", dim, " values, got ",
             w->defined() ? w->desc() : std::string("undefined"));
  const auto tl = kernels::rope_table_layout(int(head_dim), g.frames, g.height, g.width);
  TD_CHECK(tables.defined() && tables.dtype() == DType::F32 && tables.numel() == tl.total && tables.is_contiguous(),
           Shape, op, ": tables must be the f32 RoPE tables of head_dim ", head_dim, " and grid ", g.frames, "x",
           g.height, "x", g.width, " (", tl.total, " values), got ",
           tables.defined() ? tables.desc() : std::string("undefined"));

  const DType ot = out_dtype.value_or(q.dtype());
  const bool bhld = layout == kernels::RopeOutLayout::BHLD;
  const Shape mem = bhld ? Shape{B, heads, L, head_dim} : Shape{B, L, heads, head_dim};
  QK out{Tensor::empty(mem, ot, q.device()), Tensor::empty(mem, ot, q.device())};
  const auto it = elem_type(q.dtype(), op, "q"), ott = elem_type(ot, op, "out");
  kernels::Status s;
#if TURBODIFF_HAVE_CUDA
  if (q.device().is_cuda())
    s = kernels::qk_norm_rope_cuda(it, rq.ptr, rq.stride, rk.ptr, rk.stride, q_weight.data<float>(),
                                   k_weight.data<float>(), B, g.frames, g.height, g.width, int(heads), int(head_dim),
                                   eps, tables.data<float>(), layout, ott, out.q.raw_data(), out.k.raw_data(),
                                   cuda::current_stream());
  else
#endif
    s = kernels::qk_norm_rope_cpu(it, rq.ptr, rq.stride, rk.ptr, rk.stride, q_weight.data<float>(),
                                  k_weight.data<float>(), B, g.frames, g.height, g.width, int(heads), int(head_dim), eps,
                                  tables.data<float>(), layout, ott, out.q.raw_data(), out.k.raw_data());
  check_status(s, op, cat(q.desc(), ", ", heads, " heads"));
  if (bhld) {
    out.q = out.q.permute({0, 2, 1, 3});
    out.k = out.k.permute({0, 2, 1, 3});
  }
  return out;
}

}  // namespace td::ops
