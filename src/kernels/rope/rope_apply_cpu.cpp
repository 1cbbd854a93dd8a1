// fp32 CPU reference of the standalone 3-D RoPE (contract in rope_apply.h).
#include "core/thread_pool.h"
#include "kernels/norm/norm_host.h"
#include "kernels/rope/rope_apply.h"

namespace td::kernels {

Status rope_apply_check(const RopeApplyArgs& a) {
  if (a.batch < 0 || a.frames < 1 || a.height < 1 || a.width < 1 || a.heads < 1 || a.head_dim < 2 ||
      a.head_dim % 2 != 0 || !is_activation_type(a.in_type) || !is_activation_type(a.out_type))
    return Status::InvalidArgument;
  if (a.batch == 0) return Status::Ok;
  if (!a.in || !a.out || !a.tables || a.ld_in < int64_t(a.heads) * a.head_dim) return Status::InvalidArgument;
  return Status::Ok;
}

Status rope_apply_cpu(const RopeApplyArgs& a) {
  if (Status s = rope_apply_check(a); s != Status::Ok) return s;
  const int64_t L = a.frames * a.height * a.width, plane = a.height * a.width, rows = a.batch * L;
  const int64_t dim = int64_t(a.heads) * a.head_dim;
  const RopeTableLayout tl = rope_table_layout(a.head_dim, a.frames, a.height, a.width);
  const int pairs[3] = {tl.pairs_t, tl.pairs_h, tl.pairs_w};
  const float* cos_tab[3] = {a.tables + tl.cos_t, a.tables + tl.cos_h, a.tables + tl.cos_w};
  const float* sin_tab[3] = {a.tables + tl.sin_t, a.tables + tl.sin_h, a.tables + tl.sin_w};
  td::parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t l = r % L;
      const int64_t pos[3] = {l / plane, (l / a.width) % a.height, l % a.width};
      for (int h = 0; h < a.heads; ++h) {
        const int64_t base = int64_t(h) * a.head_dim;
        int p = 0;
        for (int axis = 0; axis < 3; ++axis)
          for (int j = 0; j < pairs[axis]; ++j, ++p) {
            const float c = cos_tab[axis][pos[axis] * pairs[axis] + j];
            const float s = sin_tab[axis][pos[axis] * pairs[axis] + j];
            const float re = load_act(a.in, a.in_type, r * a.ld_in + base + 2 * p);
            const float im = load_act(a.in, a.in_type, r * a.ld_in + base + 2 * p + 1);
            store_act(a.out, a.out_type, r * dim + base + 2 * p, re * c - im * s);
            store_act(a.out, a.out_type, r * dim + base + 2 * p + 1, re * s + im * c);
          }
      }
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
