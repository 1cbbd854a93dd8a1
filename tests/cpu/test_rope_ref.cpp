// The CPU references of Wan's 3-D RoPE tables and of the fused q/k RMSNorm +
// RoPE (src/kernels/rope/*_cpu.cpp) against a direct fp64 implementation
// written the way Wan's rope_params / rope_apply are (wan/modules/model.py):
// one complex table per axis from freqs = 1 / theta^(arange(0, m, 2) / m),
// concatenated, split again by [c - 2(c//3), c//3, c//3] complex columns
// (c = head_dim / 2), and applied as std::complex<double> products. Positions,
// frequencies and the split are computed here independently of the kernel's
// rope_axes / rope_table_layout.
//
// Tolerances: the tables are fp64 values rounded to fp32 (error <= 2^-25, so
// 6e-8 absolute). The fused reference works in fp32 and rounds once: fp32
// outputs are within 1e-6 (1 + |exact|) of fp64 (a few fp32 roundings of
// O(1) values); 16-bit outputs add half a unit in the last place, bounded by
// 2^-8 |exact| (bf16) and 2^-10 |exact| (fp16), which over a tensor gives
// rel_l2 <= 2^-9 ~ 2e-3 (bf16), 2^-11 ~ 5e-4 (fp16), 1e-6 (fp32).
#include <cmath>
#include <complex>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "harness/harness.h"
#include "kernels/rope/qk_norm_rope.h"
#include "kernels/rope/rope_tables.h"

namespace td::kernels {
namespace {

constexpr double kTheta = 10000.0;
constexpr float kEps = 1e-6f;

DType dtype_of(ElemType t) { return t == ElemType::F32 ? DType::F32 : t == ElemType::F16 ? DType::F16 : DType::BF16; }
const char* type_name(ElemType t) { return t == ElemType::F32 ? "f32" : t == ElemType::F16 ? "f16" : "bf16"; }
size_t elem_bytes(ElemType t) { return t == ElemType::F32 ? 4 : 2; }

// Wan's rope_params(max_seq_len, dim): [max_seq_len][dim/2] complex.
std::vector<std::vector<std::complex<double>>> wan_rope_params(int max_seq_len, int dim, double theta) {
  std::vector<std::vector<std::complex<double>>> t(static_cast<size_t>(max_seq_len));
  for (int p = 0; p < max_seq_len; ++p)
    for (int k = 0; k < dim; k += 2) t[size_t(p)].push_back(std::polar(1.0, double(p) / std::pow(theta, double(k) / dim)));
  return t;
}

// Wan's model-level table: cat(rope_params(1024, d - 4(d//6)), rope_params(1024, 2(d//6)) x 2) along columns.
struct WanFreqs {
  std::vector<std::vector<std::complex<double>>> cat;  // [1024][d/2]
  int split[3] = {0, 0, 0};                            // complex columns per axis, as rope_apply splits them
};
WanFreqs wan_freqs(int d) {
  WanFreqs w;
  const auto a = wan_rope_params(1024, d - 4 * (d / 6), kTheta);
  const auto b = wan_rope_params(1024, 2 * (d / 6), kTheta);
  const auto c = wan_rope_params(1024, 2 * (d / 6), kTheta);
  w.cat.resize(1024);
  for (size_t p = 0; p < 1024; ++p) {
    w.cat[p] = a[p];
    w.cat[p].insert(w.cat[p].end(), b[p].begin(), b[p].end());
    w.cat[p].insert(w.cat[p].end(), c[p].begin(), c[p].end());
  }
  const int half = d / 2;
  w.split[0] = half - 2 * (half / 3), w.split[1] = half / 3, w.split[2] = half / 3;
  return w;
}

TEST(RopeTables, AxisSplitIsWans) {
  EXPECT_EQ(rope_axes(128).t, 44);
  EXPECT_EQ(rope_axes(128).h, 42);
  EXPECT_EQ(rope_axes(128).w, 42);
  EXPECT_EQ(rope_axes(64).t, 24);
  EXPECT_EQ(rope_axes(64).h, 20);
  EXPECT_EQ(rope_axes(64).w, 20);
  for (int d : {64, 80, 96, 128}) {  // rope_apply's complex split equals rope_params' real sizes / 2
    const WanFreqs w = wan_freqs(d);
    EXPECT_EQ(2 * w.split[0], rope_axes(d).t) << d;
    EXPECT_EQ(2 * w.split[1], rope_axes(d).h) << d;
    EXPECT_EQ(2 * w.split[2], rope_axes(d).w) << d;
  }
}

TEST(RopeTables, MatchWanRopeParams) {
  for (int d : {128, 64, 80}) {
    const int64_t F = 21, H = 45, W = 80;  // Wan 14B 720p grid
    const RopeTableLayout l = rope_table_layout(d, F, H, W);
    std::vector<float> tab(size_t(l.total) + 1, NAN);
    ASSERT_EQ(rope_tables_cpu(d, F, H, W, kTheta, tab.data()), Status::Ok);
    EXPECT_TRUE(std::isnan(tab[size_t(l.total)])) << "wrote past the layout's total";
    const WanFreqs w = wan_freqs(d);
    const int64_t count[3] = {F, H, W};
    const int64_t cos_off[3] = {l.cos_t, l.cos_h, l.cos_w}, sin_off[3] = {l.sin_t, l.sin_h, l.sin_w};
    const int pairs[3] = {l.pairs_t, l.pairs_h, l.pairs_w};
    int col0 = 0;
    for (int axis = 0; axis < 3; ++axis) {
      ASSERT_EQ(pairs[axis], w.split[axis]);
      for (int64_t p = 0; p < count[axis]; ++p)
        for (int j = 0; j < pairs[axis]; ++j) {
          const std::complex<double> z = w.cat[size_t(p)][size_t(col0 + j)];
          ASSERT_NEAR(tab[size_t(cos_off[axis] + p * pairs[axis] + j)], z.real(), 6e-8) << d << " axis " << axis;
          ASSERT_NEAR(tab[size_t(sin_off[axis] + p * pairs[axis] + j)], z.imag(), 6e-8) << d << " axis " << axis;
        }
      col0 += pairs[axis];
    }
  }
  std::vector<float> tab(16);
  EXPECT_EQ(rope_tables_cpu(7, 1, 1, 1, kTheta, tab.data()), Status::InvalidArgument);  // odd head_dim
  EXPECT_EQ(rope_tables_cpu(64, 0, 1, 1, kTheta, tab.data()), Status::InvalidArgument);
}

struct RopeCase {
  int64_t batch, frames, height, width;
  int heads, head_dim;
};
constexpr RopeCase kCases[] = {{2, 3, 5, 7, 3, 128}, {1, 2, 3, 4, 5, 64}, {1, 4, 6, 6, 12, 128},
                               {3, 1, 1, 9, 2, 64}, {1, 2, 2, 3, 4, 80}, {2, 1, 2, 2, 1, 96}};

// Rows of one input tensor (rows = batch * L, row stride ld; padding poisoned).
struct Rows {
  ElemType type;
  int64_t rows, dim, ld;
  std::vector<unsigned char> bytes;
  double at(int64_t r, int64_t c) const { return load_as_f64(bytes.data(), dtype_of(type), size_t(r * ld + c)); }
};
Rows make_rows(ElemType t, int64_t rows, int64_t dim, int64_t ld) {
  Rows x{t, rows, dim, ld, std::vector<unsigned char>(size_t(rows * ld) * elem_bytes(t))};
  test::poison(x.bytes.data(), x.bytes.size(), dtype_of(t));
  const std::vector<float> v = test::randn(size_t(rows * dim), 0.f, 3.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) store_from_f64(x.bytes.data(), dtype_of(t), size_t(r * ld + c), v[size_t(r * dim + c)]);
  return x;
}

// Wan's rms_norm + rope_apply of one tensor in fp64, in the requested layout.
std::vector<double> wan_norm_rope(const Rows& x, const std::vector<float>& weight, const RopeCase& rc,
                                  const WanFreqs& w, RopeOutLayout layout) {
  const int64_t L = rc.frames * rc.height * rc.width, dim = x.dim;
  const int c = rc.head_dim / 2;
  std::vector<double> out(size_t(x.rows * dim));
  for (int64_t r = 0; r < x.rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < dim; ++i) ms += x.at(r, i) * x.at(r, i);
    const double rstd = 1.0 / std::sqrt(ms / double(dim) + double(kEps));
    const int64_t b = r / L, l = r % L;
    const int64_t f = l / (rc.height * rc.width), h = (l / rc.width) % rc.height, wp = l % rc.width;
    // freqs_i = cat(freqs[0][f], freqs[1][h], freqs[2][w]) with the split columns of the concatenated table.
    std::vector<std::complex<double>> fr;
    for (int k = 0; k < w.split[0]; ++k) fr.push_back(w.cat[size_t(f)][size_t(k)]);
    for (int k = 0; k < w.split[1]; ++k) fr.push_back(w.cat[size_t(h)][size_t(w.split[0] + k)]);
    for (int k = 0; k < w.split[2]; ++k) fr.push_back(w.cat[size_t(wp)][size_t(w.split[0] + w.split[1] + k)]);
    for (int head = 0; head < rc.heads; ++head) {
      for (int k = 0; k < c; ++k) {
        const int64_t i0 = int64_t(head) * rc.head_dim + 2 * k;
        const std::complex<double> z(x.at(r, i0) * rstd * weight[size_t(i0)], x.at(r, i0 + 1) * rstd * weight[size_t(i0 + 1)]);
        const std::complex<double> y = z * fr[size_t(k)];
        const int64_t base = layout == RopeOutLayout::BLHD ? r * dim + int64_t(head) * rc.head_dim
                                                           : ((b * rc.heads + head) * L + l) * rc.head_dim;
        out[size_t(base + 2 * k)] = y.real();
        out[size_t(base + 2 * k + 1)] = y.imag();
      }
    }
  }
  return out;
}

void check_against_wan(ElemType in_type, ElemType out_type, RopeOutLayout layout) {
  for (const RopeCase& rc : kCases) {
    const int64_t L = rc.frames * rc.height * rc.width, rows = rc.batch * L, dim = int64_t(rc.heads) * rc.head_dim;
    const std::string what = std::string(type_name(in_type)) + "->" + type_name(out_type) +
                             (layout == RopeOutLayout::BLHD ? " BLHD " : " BHLD ") + "heads " +
                             std::to_string(rc.heads) + " x " + std::to_string(rc.head_dim) + " grid " +
                             std::to_string(rc.frames) + "x" + std::to_string(rc.height) + "x" + std::to_string(rc.width);
    const Rows q = make_rows(in_type, rows, dim, dim + 8), k = make_rows(in_type, rows, dim, dim + 3);
    const std::vector<float> wq = test::randn(size_t(dim), 1.f, 0.2f), wk = test::randn(size_t(dim), 1.f, 0.2f);
    const RopeTableLayout tl = rope_table_layout(rc.head_dim, rc.frames, rc.height, rc.width);
    std::vector<float> tables(size_t(tl.total));
    ASSERT_EQ(rope_tables_cpu(rc.head_dim, rc.frames, rc.height, rc.width, kTheta, tables.data()), Status::Ok);

    std::vector<unsigned char> q_out(size_t(rows * dim) * elem_bytes(out_type)), k_out(q_out.size());
    test::poison(q_out.data(), q_out.size(), dtype_of(out_type));
    test::poison(k_out.data(), k_out.size(), dtype_of(out_type));
    ASSERT_EQ(qk_norm_rope_cpu(in_type, q.bytes.data(), q.ld, k.bytes.data(), k.ld, wq.data(), wk.data(), rc.batch,
                               rc.frames, rc.height, rc.width, rc.heads, rc.head_dim, kEps, tables.data(), layout,
                               out_type, q_out.data(), k_out.data()),
              Status::Ok)
        << what;

    const WanFreqs w = wan_freqs(rc.head_dim);
    const double rel_elem = out_type == ElemType::F32 ? 1e-6 : out_type == ElemType::F16 ? 0x1p-10 : 0x1p-8;
    const double max_rel_l2 = out_type == ElemType::F32 ? 1e-6 : out_type == ElemType::F16 ? 5e-4 : 2e-3;
    for (int which = 0; which < 2; ++which) {
      const std::vector<double> want = wan_norm_rope(which ? k : q, which ? wk : wq, rc, w, layout);
      const std::vector<unsigned char>& got_bytes = which ? k_out : q_out;
      std::vector<double> got(want.size());
      for (size_t i = 0; i < got.size(); ++i) got[i] = load_as_f64(got_bytes.data(), dtype_of(out_type), i);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_LE(std::fabs(got[i] - want[i]), rel_elem * std::fabs(want[i]) + 1e-6 * (1 + std::fabs(want[i])))
            << what << (which ? " k" : " q") << " element " << i << ": " << got[i] << " vs " << want[i];
      TD_EXPECT_CLOSE(test::compare(got, want), max_rel_l2, 1 - max_rel_l2);
    }
  }
}

TEST(QkNormRopeRef, MatchesWanRopeApplyBf16) {
  check_against_wan(ElemType::BF16, ElemType::BF16, RopeOutLayout::BLHD);
  check_against_wan(ElemType::BF16, ElemType::BF16, RopeOutLayout::BHLD);
  check_against_wan(ElemType::BF16, ElemType::F32, RopeOutLayout::BHLD);
}
TEST(QkNormRopeRef, MatchesWanRopeApplyF16AndF32) {
  check_against_wan(ElemType::F16, ElemType::F16, RopeOutLayout::BHLD);
  check_against_wan(ElemType::F32, ElemType::F32, RopeOutLayout::BLHD);
  check_against_wan(ElemType::F32, ElemType::BF16, RopeOutLayout::BHLD);
}

TEST(QkNormRopeRef, BadArguments) {
  std::vector<float> x(256, 1.f), w(256, 1.f), tab(4096), out(256);
  const RopeTableLayout tl = rope_table_layout(64, 1, 1, 2);
  ASSERT_LE(tl.total, 4096);
  ASSERT_EQ(rope_tables_cpu(64, 1, 1, 2, kTheta, tab.data()), Status::Ok);
  auto call = [&](int head_dim, int64_t ld, ElemType out_type) {
    return qk_norm_rope_cpu(ElemType::F32, x.data(), ld, x.data(), ld, w.data(), w.data(), 1, 1, 1, 2, 2, head_dim,
                            kEps, tab.data(), RopeOutLayout::BLHD, out_type, out.data(), out.data());
  };
  EXPECT_EQ(call(63, 128, ElemType::F32), Status::InvalidArgument);   // odd head_dim
  EXPECT_EQ(call(64, 100, ElemType::F32), Status::InvalidArgument);   // ld < dim
  EXPECT_EQ(call(64, 128, ElemType::I8), Status::InvalidArgument);    // output type
  EXPECT_EQ(call(64, 128, ElemType::F32), Status::Ok);
}

}  // namespace
}  // namespace td::kernels
