#include "ops/layout.h"

#include "core/cuda_runtime.h"
#include "kernels/layout/patchify.h"
#include "kernels/rope/rope_apply.h"
#include "ops/common.h"

namespace td::ops {

Tensor patchify(const Tensor& latent_in, int64_t pt, int64_t ph, int64_t pw, DType out_dtype) {
  static const char* op = "patchify";
  TD_CHECK(latent_in.defined() && latent_in.dim() == 5, Shape, op, ": latent must be [B, C, T, H, W], got ",
           latent_in.defined() ? latent_in.desc() : std::string("undefined"));
  TD_CHECK(latent_in.dtype() == DType::F32, DType, op, ": latent must be f32, got ", latent_in.desc());
  TD_CHECK(out_dtype == DType::F32 || out_dtype == DType::BF16, DType, op, ": output f32 or bf16, got ",
           dtype_name(out_dtype));
  const Tensor latent = latent_in.is_contiguous() ? latent_in : latent_in.contiguous();
  kernels::PatchGeometry g{latent.size(0), latent.size(1), latent.size(2), latent.size(3), latent.size(4), pt, ph, pw};
  TD_CHECK(kernels::patchify_check(g, kernels::ElemType::F32) == kernels::Status::Ok, Shape, op, ": ", latent.desc(),
           " does not split into ", pt, "x", ph, "x", pw, " patches");
  const int64_t L = (g.frames / pt) * (g.height / ph) * (g.width / pw);
  Tensor out = Tensor::empty({g.batch, L, g.channels * pt * ph * pw}, out_dtype, latent.device());
  const auto ot = elem_type(out_dtype, op, "out");
  kernels::Status s;
#if TURBODIFF_HAVE_CUDA
  if (latent.device().is_cuda())
    s = kernels::patchify_cuda(g, latent.data<float>(), ot, out.raw_data(), cuda::current_stream());
  else
#endif
    s = kernels::patchify_cpu(g, latent.data<float>(), ot, out.raw_data());
  check_status(s, op, latent.desc());
  return out;
}

Tensor unpatchify(const Tensor& tokens_in, int64_t T, int64_t H, int64_t W, int64_t pt, int64_t ph, int64_t pw) {
  static const char* op = "unpatchify";
  TD_CHECK(tokens_in.defined() && tokens_in.dim() == 3 && tokens_in.dtype() == DType::F32, Shape, op,
           ": tokens must be f32 [B, L, features], got ",
           tokens_in.defined() ? tokens_in.desc() : std::string("undefined"));
  const Tensor tokens = tokens_in.is_contiguous() ? tokens_in : tokens_in.contiguous();
  const int64_t B = tokens.size(0), L = tokens.size(1), F = tokens.size(2), vol = pt * ph * pw;
  TD_CHECK(pt > 0 && ph > 0 && pw > 0 && T % pt == 0 && H % ph == 0 && W % pw == 0 && F % vol == 0 &&
               L == (T / pt) * (H / ph) * (W / pw),
           Shape, op, ": ", tokens.desc(), " does not fit a ", T, "x", H, "x", W, " latent of ", pt, "x", ph, "x", pw,
           " patches");
  const kernels::PatchGeometry g{B, F / vol, T, H, W, pt, ph, pw};
  Tensor out = Tensor::empty({B, F / vol, T, H, W}, DType::F32, tokens.device());
  kernels::Status s;
#if TURBODIFF_HAVE_CUDA
  if (tokens.device().is_cuda())
    s = kernels::unpatchify_cuda(g, tokens.data<float>(), out.data<float>(), cuda::current_stream());
  else
#endif
    s = kernels::unpatchify_cpu(g, tokens.data<float>(), out.data<float>());
  check_status(s, op, tokens.desc());
  return out;
}

Tensor rope_apply(const Tensor& x, const Tensor& tables, const PatchGrid& g, int64_t heads,
                  std::optional<DType> out_dtype) {
  static const char* op = "rope_apply";
  check_same_device(op, {{"x", &x}, {"tables", &tables}});
  TD_CHECK(x.dim() == 3, Shape, op, ": x must be [B, L, dim], got ", x.desc());
  const int64_t B = x.size(0), L = x.size(1), dim = x.size(2);
  TD_CHECK(L == g.tokens(), Shape, op, ": x has ", L, " tokens but the patch grid ", g.frames, "x", g.height, "x",
           g.width, " has ", g.tokens());
  TD_CHECK(heads >= 1 && dim % heads == 0 && (dim / heads) % 2 == 0, Shape, op, ": dim ", dim, " must split into ",
           heads, " heads of an even size");
  const int64_t head_dim = dim / heads;
  const auto tl = kernels::rope_table_layout(int(head_dim), g.frames, g.height, g.width);
  TD_CHECK(tables.defined() && tables.dtype() == DType::F32 && tables.numel() == tl.total && tables.is_contiguous(),
           Shape, op, ": tables must be the f32 RoPE tables of head_dim ", head_dim, " (", tl.total, " values), got ",
           tables.defined() ? tables.desc() : std::string("undefined"));
  const Rows r = as_rows(x, op, "x");
  const DType ot = out_dtype.value_or(x.dtype());
  Tensor out = Tensor::empty({B, L, heads, head_dim}, ot, x.device());
  kernels::RopeApplyArgs a;
  a.in_type = elem_type(x.dtype(), op, "x");
  a.out_type = elem_type(ot, op, "out");
  a.in = r.ptr;
  a.ld_in = r.stride;
  a.out = out.raw_data();
  a.batch = B;
  a.frames = g.frames;
  a.height = g.height;
  a.width = g.width;
  a.heads = int(heads);
  a.head_dim = int(head_dim);
  a.tables = tables.data<float>();
  kernels::Status s;
#if TURBODIFF_HAVE_CUDA
  if (x.device().is_cuda())
    s = kernels::rope_apply_cuda(a, cuda::current_stream());
  else
#endif
    s = kernels::rope_apply_cpu(a);
  check_status(s, op, x.desc());
  return out;
}

}  // namespace td::ops
