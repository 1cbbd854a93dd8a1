// Wan's 3-D rotary position embedding (Wan2.1 wan/modules/model.py:
// rope_params / rope_apply), as small cos/sin tables built on the host in
// fp64 and read by the qk_norm_rope kernels.
//
// A head of head_dim d real channels is split into three consecutive axis
// segments: t (frames) d - 4*floor(d/6), h (patch rows) 2*floor(d/6) and w
// (patch columns) 2*floor(d/6) channels (44/42/42 for d = 128, 24/20/20 for
// d = 64). Within a segment of m channels, the interleaved pair
// (x[2j], x[2j+1]), j < m/2, is rotated as the complex number x[2j] + i x[2j+1]
// times exp(i * pos * theta^(-2j/m)), pos being the token's index along that
// axis. Token l of a sample sits at (f, h, w) = row-major over the latent
// patch grid (F, Hp, Wp), l = (f * Hp + h) * Wp + w.
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

// Real channels of each axis segment for a head of head_dim channels.
struct RopeAxes {
  int t = 0, h = 0, w = 0;
};
inline RopeAxes rope_axes(int head_dim) {
  const int s = head_dim / 6;
  return {head_dim - 4 * s, 2 * s, 2 * s};
}

// Where each table lies in the one fp32 buffer rope_tables_cpu fills (offsets
// in floats). cos_t[f * pairs_t + j] = cos(f * theta^(-2j/m_t)), likewise sin,
// h and w with their own position counts (F, Hp, Wp) and pair counts.
struct RopeTableLayout {
  int pairs_t = 0, pairs_h = 0, pairs_w = 0;  // m_axis / 2
  int64_t cos_t = 0, sin_t = 0, cos_h = 0, sin_h = 0, cos_w = 0, sin_w = 0;
  int64_t total = 0;  // floats in the buffer
};
RopeTableLayout rope_table_layout(int head_dim, int64_t frames, int64_t height, int64_t width);

// Fills `tables` (rope_table_layout(...).total floats) with the angles
// computed and their cos/sin taken in fp64, then rounded to fp32. head_dim
// must be even and >= 2, the grid sizes >= 1, theta > 0 (Wan: 10000).
Status rope_tables_cpu(int head_dim, int64_t frames, int64_t height, int64_t width, double theta, float* tables);

}  // namespace td::kernels
