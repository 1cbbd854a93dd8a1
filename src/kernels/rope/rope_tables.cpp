// Host construction of the 3-D RoPE cos/sin tables (fp64 angles, fp32 values).
#include "kernels/rope/rope_tables.h"

#include <cmath>

namespace td::kernels {

RopeTableLayout rope_table_layout(int head_dim, int64_t frames, int64_t height, int64_t width) {
  const RopeAxes a = rope_axes(head_dim);
  RopeTableLayout l;
  l.pairs_t = a.t / 2;
  l.pairs_h = a.h / 2;
  l.pairs_w = a.w / 2;
  int64_t off = 0;
  l.cos_t = off, off += frames * l.pairs_t;
  l.sin_t = off, off += frames * l.pairs_t;
  l.cos_h = off, off += height * l.pairs_h;
  l.sin_h = off, off += height * l.pairs_h;
  l.cos_w = off, off += width * l.pairs_w;
  l.sin_w = off, off += width * l.pairs_w;
  l.total = off;
  return l;
}

namespace {

// cos/sin of pos * theta^(-2j/m) for pos < positions, j < m/2, as Wan's
// rope_params: freqs = 1 / theta^(arange(0, m, 2) / m), angles = outer(pos, freqs).
void fill_axis(int64_t positions, int m, double theta, float* cos_out, float* sin_out) {
  const int pairs = m / 2;
  for (int j = 0; j < pairs; ++j) {
    const double freq = 1.0 / std::pow(theta, double(2 * j) / double(m));
    for (int64_t p = 0; p < positions; ++p) {
      const double angle = double(p) * freq;
      cos_out[p * pairs + j] = float(std::cos(angle));
      sin_out[p * pairs + j] = float(std::sin(angle));
    }
  }
}

}  // namespace

Status rope_tables_cpu(int head_dim, int64_t frames, int64_t height, int64_t width, double theta, float* tables) {
  if (head_dim < 2 || head_dim % 2 != 0 || frames < 1 || height < 1 || width < 1 || !(theta > 0) || !tables)
    return Status::InvalidArgument;
  const RopeAxes a = rope_axes(head_dim);
  const RopeTableLayout l = rope_table_layout(head_dim, frames, height, width);
  fill_axis(frames, a.t, theta, tables + l.cos_t, tables + l.sin_t);
  fill_axis(height, a.h, theta, tables + l.cos_h, tables + l.sin_h);
  fill_axis(width, a.w, theta, tables + l.cos_w, tables + l.sin_w);
  return Status::Ok;
}

}  // namespace td::kernels
