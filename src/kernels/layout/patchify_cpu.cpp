// fp32 CPU reference of patchify / unpatchify (contract in patchify.h).
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/layout/patchify.h"

namespace td::kernels {

Status patchify_check(const PatchGeometry& g, ElemType out_type) {
  if (g.batch <= 0 || g.channels <= 0 || g.frames <= 0 || g.height <= 0 || g.width <= 0 || g.pt <= 0 || g.ph <= 0 ||
      g.pw <= 0)
    return Status::InvalidArgument;
  if (g.frames % g.pt || g.height % g.ph || g.width % g.pw) return Status::InvalidArgument;
  if (out_type != ElemType::F32 && out_type != ElemType::BF16) return Status::InvalidArgument;
  return Status::Ok;
}

Status patchify_cpu(const PatchGeometry& g, const float* latent, ElemType out_type, void* tokens) {
  if (Status s = patchify_check(g, out_type); s != Status::Ok) return s;
  if (!latent || !tokens) return Status::InvalidArgument;
  const int64_t C = g.channels, T = g.frames, H = g.height, W = g.width;
  const int64_t Hp = H / g.ph, Wp = W / g.pw, L = (T / g.pt) * Hp * Wp, F = C * g.pt * g.ph * g.pw;
  td::parallel_for(g.batch * L, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / L, l = r % L, f = l / (Hp * Wp), h = (l / Wp) % Hp, w = l % Wp;
      int64_t i = r * F;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t kt = 0; kt < g.pt; ++kt)
          for (int64_t kh = 0; kh < g.ph; ++kh)
            for (int64_t kw = 0; kw < g.pw; ++kw, ++i) {
              const float v = latent[(((b * C + c) * T + f * g.pt + kt) * H + h * g.ph + kh) * W + w * g.pw + kw];
              if (out_type == ElemType::F32)
                static_cast<float*>(tokens)[i] = v;
              else
                static_cast<uint16_t*>(tokens)[i] = td::f32_to_bf16(v);
            }
    }
  });
  return Status::Ok;
}

Status unpatchify_cpu(const PatchGeometry& g, const float* tokens, float* latent) {
  if (Status s = patchify_check(g, ElemType::F32); s != Status::Ok) return s;
  if (!latent || !tokens) return Status::InvalidArgument;
  const int64_t C = g.channels, T = g.frames, H = g.height, W = g.width;
  const int64_t Hp = H / g.ph, Wp = W / g.pw, L = (T / g.pt) * Hp * Wp, F = C * g.pt * g.ph * g.pw;
  td::parallel_for(g.batch * L, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / L, l = r % L, f = l / (Hp * Wp), h = (l / Wp) % Hp, w = l % Wp;
      const float* row = tokens + r * F;
      int64_t i = 0;
      for (int64_t kt = 0; kt < g.pt; ++kt)
        for (int64_t kh = 0; kh < g.ph; ++kh)
          for (int64_t kw = 0; kw < g.pw; ++kw)
            for (int64_t c = 0; c < C; ++c)
              latent[(((b * C + c) * T + f * g.pt + kt) * H + h * g.ph + kh) * W + w * g.pw + kw] = row[i++];
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
