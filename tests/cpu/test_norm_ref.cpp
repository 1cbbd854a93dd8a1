// The fp32 CPU references of the norm kernels (src/kernels/norm/*_cpu.cpp)
// against direct fp64 evaluations of their formulas, on fresh random inputs
// of awkward sizes, every activation type, poisoned outputs with poisoned row
// padding, in-place use and bad arguments.
//
// Tolerances: the references compute in fp32 (sums in double) and round once
// to the output type, so against the exact value each element may be off by
// half a unit in the last place of the output type plus fp32 arithmetic
// error (bounded here by 2e-6 * (1 + |exact|)). Over a whole tensor that
// makes rel_l2 <= the type's unit roundoff: 2^-8 ~ 3.9e-3 (bf16),
// 2^-11 ~ 4.9e-4 (fp16); fp32 outputs get 1e-6.
#include <cmath>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "harness/kernel_rows.h"
#include "kernels/norm/adaln_modulate.h"
#include "kernels/norm/layer_norm.h"
#include "kernels/norm/norm_host.h"
#include "kernels/norm/residual_gate_norm.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/quant/quant_token128.h"

namespace td::kernels {
namespace {

using namespace test_rows;

constexpr ElemType kActTypes[] = {ElemType::F32, ElemType::F16, ElemType::BF16};
constexpr int64_t kRowCounts[] = {1, 37, 333};
// 77: not a multiple of 8 (the GPU's scalar path); 96, 1000: odd multiples of 8; then Wan's and UMT5's widths.
constexpr int64_t kDims[] = {64, 77, 96, 1000, 1536, 4096, 5120};
constexpr float kEps = 1e-6f;


// Checks out (type t) against the exact values: every element within half an
// ulp plus fp32 slack, and the whole-tensor metrics of the file comment.
void expect_matches_exact(const Rows& out, const std::vector<double>& exact, const std::string& what) {
  const std::vector<double> got = out.values();
  ASSERT_EQ(got.size(), exact.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = 0.5 * ulp(out.type, exact[i]) + 2e-6 * (1.0 + std::fabs(exact[i]));
    if (!(std::fabs(got[i] - exact[i]) <= tol)) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": first bad element " << first << " (row " << first / size_t(out.dim) << "): "
                     << got[first] << " vs exact " << exact[first] << " seed=" << test::current_seed();
  const double max_rel_l2 = out.type == ElemType::F32 ? 1e-6 : out.type == ElemType::F16 ? 4.9e-4 : 3.9e-3;
  const double min_cos = out.type == ElemType::BF16 ? 0.99999 : 0.999999;
  SCOPED_TRACE(what);
  TD_EXPECT_CLOSE(test::compare(got, exact), max_rel_l2, min_cos);
  EXPECT_EQ(out.padding_written(), 0u) << what << ": row padding overwritten";
}

std::string label(const char* op, ElemType xt, ElemType yt, int64_t rows, int64_t dim) {
  return std::string(op) + " " + type_name(xt) + "->" + type_name(yt) + " " + std::to_string(rows) + "x" +
         std::to_string(dim);
}

// ---- fp64 formulas ---------------------------------------------------------------

struct RowStats {
  double mean, rstd;
};
RowStats layer_stats(const std::vector<double>& row, double eps) {
  double s = 0;
  for (double v : row) s += v;
  const double mean = s / double(row.size());
  double s2 = 0;
  for (double v : row) s2 += (v - mean) * (v - mean);
  return {mean, 1.0 / std::sqrt(s2 / double(row.size()) + eps)};
}
std::vector<double> row_of(const Rows& x, int64_t r) {
  std::vector<double> v(size_t(x.dim));
  for (int64_t i = 0; i < x.dim; ++i) v[size_t(i)] = x.at(r, i);
  return v;
}

std::vector<double> rms_exact(const Rows& x, const float* w, double eps) {
  std::vector<double> out;
  for (int64_t r = 0; r < x.rows; ++r) {
    const std::vector<double> row = row_of(x, r);
    double s2 = 0;
    for (double v : row) s2 += v * v;
    const double rstd = 1.0 / std::sqrt(s2 / double(x.dim) + eps);
    for (int64_t i = 0; i < x.dim; ++i) out.push_back(row[size_t(i)] * rstd * (w ? w[i] : 1.0));
  }
  return out;
}

// LN(row) * weight + bias, then * (1 + scale[b]) + shift[b]; null pointers drop their term.
struct Affine {
  const float* weight = nullptr;
  const float* bias = nullptr;
  const float* scale = nullptr;
  const float* shift = nullptr;
  int64_t mod_stride = 0, rows_per_batch = 1;
};
void layer_exact_row(const std::vector<double>& row, int64_t r, const Affine& p, double eps, std::vector<double>& out) {
  const RowStats st = layer_stats(row, eps);
  const int64_t m = (r / p.rows_per_batch) * p.mod_stride;
  for (size_t i = 0; i < row.size(); ++i) {
    double v = (row[i] - st.mean) * st.rstd;
    if (p.weight) v *= p.weight[i];
    if (p.bias) v += p.bias[i];
    if (p.scale) v *= 1.0 + p.scale[m + int64_t(i)];
    if (p.shift) v += p.shift[m + int64_t(i)];
    out.push_back(v);
  }
}
std::vector<double> layer_exact(const Rows& x, const Affine& p, double eps) {
  std::vector<double> out;
  for (int64_t r = 0; r < x.rows; ++r) layer_exact_row(row_of(x, r), r, p, eps, out);
  return out;
}

// ---- rms_norm -------------------------------------------------------------------

TEST(RmsNormRef, MatchesFp64EveryTypeAndSize) {
  for (ElemType t : kActTypes)
    for (int64_t rows : kRowCounts)
      for (int64_t dim : kDims) {
        const Rows x = random_rows(t, rows, dim, dim, 0.f, 1.f);
        const std::vector<float> w = test::randn(size_t(dim), 1.f, 0.3f);
        const bool with_weight = (rows + dim) % 2 == 0;  // both variants across the grid
        Rows y(t, rows, dim, dim);
        ASSERT_EQ(rms_norm_cpu(x.data(), t, dim, y.data(), t, dim, with_weight ? w.data() : nullptr, rows, dim, kEps),
                  Status::Ok);
        expect_matches_exact(y, rms_exact(x, with_weight ? w.data() : nullptr, kEps), label("rms_norm", t, t, rows, dim));
      }
}

TEST(RmsNormRef, MixedTypesStridedAndInPlace) {
  const int64_t rows = 37, dim = 1000, xs = 1016, ys = 1008;
  const std::vector<float> w = test::randn(size_t(dim), 1.f, 0.3f);
  for (ElemType xt : kActTypes)
    for (ElemType yt : kActTypes) {
      const Rows x = random_rows(xt, rows, dim, xs, 0.f, 3.f);
      Rows y(yt, rows, dim, ys);
      ASSERT_EQ(rms_norm_cpu(x.data(), xt, xs, y.data(), yt, ys, w.data(), rows, dim, kEps), Status::Ok);
      expect_matches_exact(y, rms_exact(x, w.data(), kEps), label("rms_norm strided", xt, yt, rows, dim));
    }
  for (ElemType t : kActTypes) {
    Rows x = random_rows(t, rows, dim, xs, 0.f, 1.f);
    const std::vector<double> exact = rms_exact(x, w.data(), kEps);
    ASSERT_EQ(rms_norm_cpu(x.data(), t, xs, x.data(), t, xs, w.data(), rows, dim, kEps), Status::Ok);
    expect_matches_exact(x, exact, label("rms_norm in place", t, t, rows, dim));
  }
}

// ---- layer_norm -------------------------------------------------------------------

TEST(LayerNormRef, MatchesFp64EveryTypeAndSize) {
  for (ElemType t : kActTypes)
    for (int64_t rows : kRowCounts)
      for (int64_t dim : kDims) {
        // a large mean next to a small spread: one-pass (E[x^2] - mean^2) variance would lose it
        const Rows x = random_rows(t, rows, dim, dim, 4.f, 0.5f);
        const std::vector<float> w = test::randn(size_t(dim), 1.f, 0.3f), b = test::randn(size_t(dim), 0.f, 0.5f);
        const int variant = int((rows + dim) % 3);  // none / weight / weight + bias
        Affine p;
        p.weight = variant >= 1 ? w.data() : nullptr;
        p.bias = variant >= 2 ? b.data() : nullptr;
        Rows y(t, rows, dim, dim);
        ASSERT_EQ(layer_norm_cpu(x.data(), t, dim, y.data(), t, dim, p.weight, p.bias, rows, dim, kEps), Status::Ok);
        expect_matches_exact(y, layer_exact(x, p, kEps), label("layer_norm", t, t, rows, dim));
      }
}

TEST(LayerNormRef, MixedTypesStridedAndInPlace) {
  const int64_t rows = 37, dim = 96, xs = 104, ys = 200;
  const std::vector<float> w = test::randn(size_t(dim), 1.f, 0.3f), b = test::randn(size_t(dim), 0.f, 0.5f);
  Affine p;
  p.weight = w.data();
  p.bias = b.data();
  for (ElemType xt : kActTypes)
    for (ElemType yt : kActTypes) {
      const Rows x = random_rows(xt, rows, dim, xs, -1.f, 2.f);
      Rows y(yt, rows, dim, ys);
      ASSERT_EQ(layer_norm_cpu(x.data(), xt, xs, y.data(), yt, ys, w.data(), b.data(), rows, dim, kEps), Status::Ok);
      expect_matches_exact(y, layer_exact(x, p, kEps), label("layer_norm strided", xt, yt, rows, dim));
    }
  for (ElemType t : kActTypes) {
    Rows x = random_rows(t, rows, dim, xs, 0.f, 1.f);
    const std::vector<double> exact = layer_exact(x, p, kEps);
    ASSERT_EQ(layer_norm_cpu(x.data(), t, xs, x.data(), t, xs, w.data(), b.data(), rows, dim, kEps), Status::Ok);
    expect_matches_exact(x, exact, label("layer_norm in place", t, t, rows, dim));
  }
}

TEST(LayerNormRef, ConstantRowGivesBias) {
  // var = 0: the output is exactly bias (x - mean = 0), no NaN from rsqrt(eps).
  const int64_t rows = 3, dim = 64;
  Rows x(ElemType::F32, rows, dim, dim);
  for (int64_t i = 0; i < rows * dim; ++i) store_act(x.data(), ElemType::F32, i, 2.5f);
  const std::vector<float> w = test::randn(size_t(dim), 1.f, 0.3f), b = test::randn(size_t(dim));
  Rows y(ElemType::F32, rows, dim, dim);
  ASSERT_EQ(layer_norm_cpu(x.data(), ElemType::F32, dim, y.data(), ElemType::F32, dim, w.data(), b.data(), rows, dim,
                           kEps),
            Status::Ok);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) ASSERT_EQ(y.at(r, i), double(b[size_t(i)]));
}

// ---- adaln_modulate -------------------------------------------------------------------

TEST(AdaLnModulateRef, MatchesFp64EveryTypeSizeAndBatching) {
  for (ElemType t : kActTypes)
    for (int64_t rows : kRowCounts)
      for (int64_t dim : kDims) {
        // Wan's layout: e0 rows [batch, 6, dim]; shift = e0[:, 0], scale = e0[:, 1], mod_stride = 6 * dim.
        const int64_t rows_per_batch = rows == 1 ? 1 : (rows + 2) / 3;  // 3 samples, the last one short
        const int64_t batch = (rows + rows_per_batch - 1) / rows_per_batch;
        const std::vector<float> e0 = test::randn(size_t(batch * 6 * dim), 0.f, 0.5f);
        Affine p;
        p.shift = e0.data();
        p.scale = e0.data() + dim;
        p.mod_stride = 6 * dim;
        p.rows_per_batch = rows_per_batch;
        const Rows x = random_rows(t, rows, dim, dim, 0.3f, 1.5f);
        Rows y(t, rows, dim, dim);
        ASSERT_EQ(adaln_modulate_cpu(x.data(), t, dim, y.data(), t, dim, p.scale, p.shift, p.mod_stride,
                                     rows_per_batch, rows, dim, kEps),
                  Status::Ok);
        expect_matches_exact(y, layer_exact(x, p, kEps), label("adaln_modulate", t, t, rows, dim));
      }
}

TEST(AdaLnModulateRef, MixedTypesPerTokenSharedRowAndInPlace) {
  const int64_t rows = 37, dim = 1536;
  for (ElemType xt : kActTypes)
    for (ElemType yt : kActTypes) {
      // per-token modulation (Wan2.2 TI2V): rows_per_batch = 1, one scale/shift row per token
      const std::vector<float> scale = test::randn(size_t(rows * dim), 0.f, 0.5f);
      const std::vector<float> shift = test::randn(size_t(rows * dim), 0.f, 0.5f);
      Affine p;
      p.scale = scale.data();
      p.shift = shift.data();
      p.mod_stride = dim;
      p.rows_per_batch = 1;
      const Rows x = random_rows(xt, rows, dim, dim, 0.f, 1.f);
      Rows y(yt, rows, dim, dim + 8);
      ASSERT_EQ(adaln_modulate_cpu(x.data(), xt, dim, y.data(), yt, dim + 8, p.scale, p.shift, dim, 1, rows, dim, kEps),
                Status::Ok);
      expect_matches_exact(y, layer_exact(x, p, kEps), label("adaln per token", xt, yt, rows, dim));
    }
  for (ElemType t : kActTypes) {
    // mod_stride 0: one row shared by every sample; scale only (shift null); in place
    const std::vector<float> scale = test::randn(size_t(dim), 0.f, 0.5f);
    Affine p;
    p.scale = scale.data();
    p.rows_per_batch = 5;
    Rows x = random_rows(t, rows, dim, dim, 0.f, 1.f);
    const std::vector<double> exact = layer_exact(x, p, kEps);
    ASSERT_EQ(adaln_modulate_cpu(x.data(), t, dim, x.data(), t, dim, scale.data(), nullptr, 0, 5, rows, dim, kEps),
              Status::Ok);
    expect_matches_exact(x, exact, label("adaln in place", t, t, rows, dim));
  }
}

// ---- residual_gate_norm -------------------------------------------------------------------

struct RgnCase {
  bool gate, affine, modulation;
};
// Wan's three uses, everything at once, and nothing but the add.
constexpr RgnCase kRgnCases[] = {{true, true, false}, {false, false, true}, {true, false, true},
                                 {true, true, true},  {false, false, false}};

// Runs residual_gate_norm_cpu on fresh inputs and checks x_out and out against
// the definition: x_new = round_res(fp32(x + fp32(gate * y))) (the eager
// PyTorch sum, computed here in fp32 because it is part of the definition),
// then the norm of x_new in fp64.
void check_rgn(ElemType rt, ElemType yt, ElemType ot, int64_t rows, int64_t dim, RgnCase c, bool in_place,
               int64_t pad) {
  const int64_t rows_per_batch = std::max<int64_t>(1, (rows + 1) / 2);
  const int64_t batch = (rows + rows_per_batch - 1) / rows_per_batch;
  const std::vector<float> e0 = test::randn(size_t(batch * 6 * dim), 0.f, 0.5f);
  const std::vector<float> w = test::randn(size_t(dim), 1.f, 0.3f), b = test::randn(size_t(dim), 0.f, 0.5f);
  Rows x = random_rows(rt, rows, dim, dim + pad, 0.2f, 2.f);
  const Rows y = random_rows(yt, rows, dim, dim + 2 * pad, 0.f, 1.f);
  Rows x_out(rt, rows, dim, dim + pad);
  Rows out(ot, rows, dim, dim + 3 * pad);

  ResidualGateNormParams p;
  p.x = x.data();
  p.x_stride = dim + pad;
  p.x_out = in_place ? x.data() : x_out.data();
  p.x_out_stride = dim + pad;
  p.residual_type = rt;
  p.y = y.data();
  p.y_type = yt;
  p.y_stride = dim + 2 * pad;
  p.out = out.data();
  p.out_type = ot;
  p.out_stride = dim + 3 * pad;
  p.gate = c.gate ? e0.data() + 2 * dim : nullptr;
  p.weight = c.affine ? w.data() : nullptr;
  p.bias = c.affine ? b.data() : nullptr;
  p.scale = c.modulation ? e0.data() + 4 * dim : nullptr;
  p.shift = c.modulation ? e0.data() + 3 * dim : nullptr;
  p.mod_stride = 6 * dim;
  p.rows_per_batch = rows_per_batch;
  p.rows = rows;
  p.dim = dim;
  p.eps = kEps;

  // the expected values, from the inputs before the call (x may be overwritten)
  std::vector<double> exact_x, exact_out;
  Affine a;
  a.weight = p.weight;
  a.bias = p.bias;
  a.scale = p.scale;
  a.shift = p.shift;
  a.mod_stride = p.mod_stride;
  a.rows_per_batch = rows_per_batch;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> row(static_cast<size_t>(dim));
    for (int64_t i = 0; i < dim; ++i) {
      const float g = p.gate ? p.gate[(r / rows_per_batch) * p.mod_stride + i] : 1.f;
      const float added = p.gate ? g * float(y.at(r, i)) : float(y.at(r, i));
      row[size_t(i)] = round_to_act(rt, float(x.at(r, i)) + added);
      exact_x.push_back(row[size_t(i)]);
    }
    layer_exact_row(row, r, a, kEps, exact_out);
  }

  ASSERT_EQ(residual_gate_norm_cpu(p), Status::Ok);
  const std::string what = std::string("residual_gate_norm res=") + type_name(rt) + " y=" + type_name(yt) +
                           " out=" + type_name(ot) + " " + std::to_string(rows) + "x" + std::to_string(dim) +
                           " gate=" + std::to_string(c.gate) + " affine=" + std::to_string(c.affine) +
                           " mod=" + std::to_string(c.modulation) + (in_place ? " in place" : "");
  const Rows& new_x = in_place ? x : x_out;
  const std::vector<double> got_x = new_x.values();
  EXPECT_EQ(got_x, exact_x) << what << ": x_out differs from round(x + gate * y)";
  EXPECT_EQ(new_x.padding_written(), 0u) << what;
  expect_matches_exact(out, exact_out, what);
}

TEST(ResidualGateNormRef, MatchesDefinitionEverySize) {
  int i = 0;
  for (ElemType rt : {ElemType::F32, ElemType::BF16})
    for (int64_t rows : kRowCounts)
      for (int64_t dim : kDims) {
        const RgnCase c = kRgnCases[size_t(i++) % 5];
        check_rgn(rt, ElemType::BF16, ElemType::BF16, rows, dim, c, /*in_place=*/i % 2 == 0, /*pad=*/0);
      }
}

TEST(ResidualGateNormRef, EveryTypeCombinationAndCase) {
  for (ElemType rt : {ElemType::F32, ElemType::BF16})
    for (ElemType yt : kActTypes)
      for (ElemType ot : kActTypes)
        for (const RgnCase& c : kRgnCases) check_rgn(rt, yt, ot, 37, 96, c, /*in_place=*/c.gate, /*pad=*/8);
}

// ---- argument checks ------------------------------------------------------------------------

// The token128 output of residual_gate_norm (codes and scales of the output
// rounded to out_type, out itself optional): the same new residual, codes and
// scales as the op followed by the token128 quantizer, with and without out;
// partial groups (dim 200); bad code arguments rejected.
TEST(ResidualGateNormRef, QuantizedOutputEqualsTheOpThenTheQuantizer) {
  for (const ElemType rt : {ElemType::F32, ElemType::BF16})
    for (const int64_t dim : {int64_t(256), int64_t(200)}) {
      const int64_t rows = 9, ld = rows + 2, kb = (dim + 127) / 128;
      const std::vector<float> gate = test::randn(size_t(dim), 0.f, 0.5f), w = test::randn(size_t(dim), 1.f, 0.3f);
      const Rows x = random_rows(rt, rows, dim, dim, 0.2f, 2.f);
      const Rows y = random_rows(ElemType::BF16, rows, dim, dim, 0.f, 1.f);
      ResidualGateNormParams p;
      p.residual_type = rt;
      p.y_type = p.out_type = ElemType::BF16;
      p.x_stride = p.x_out_stride = p.y_stride = p.out_stride = dim;
      p.y = y.data();
      p.gate = gate.data();
      p.weight = w.data();
      p.mod_stride = 0;
      p.rows_per_batch = rows;
      p.rows = rows;
      p.dim = dim;
      // the two ops
      Rows x1 = x, out1(ElemType::BF16, rows, dim, dim);
      std::vector<int8_t> codes1(size_t(rows * dim), 0x55), codes2 = codes1, codes3 = codes1;
      std::vector<float> scales1(size_t(kb * ld), -1.f), scales2 = scales1, scales3 = scales1;
      p.x = p.x_out = x1.data();
      p.out = out1.data();
      ASSERT_EQ(residual_gate_norm_cpu(p), Status::Ok);
      ASSERT_EQ(quantize_token128_cpu(ElemType::BF16, out1.data(), rows, dim, dim, codes1.data(), dim, scales1.data(), ld),
                Status::Ok);
      // codes without out, then with out
      Rows x2 = x, x3 = x, out3(ElemType::BF16, rows, dim, dim);
      p.x = p.x_out = x2.data();
      p.out = nullptr;
      p.codes = codes2.data();
      p.codes_stride = dim;
      p.code_scales = scales2.data();
      p.ld_scales = ld;
      ASSERT_EQ(residual_gate_norm_cpu(p), Status::Ok);
      p.x = p.x_out = x3.data();
      p.out = out3.data();
      p.codes = codes3.data();
      p.code_scales = scales3.data();
      ASSERT_EQ(residual_gate_norm_cpu(p), Status::Ok);
      EXPECT_TRUE(x2.bytes == x1.bytes && x3.bytes == x1.bytes) << "the new residual differs";
      EXPECT_TRUE(codes2 == codes1 && codes3 == codes1) << "codes differ";
      EXPECT_TRUE(scales2 == scales1 && scales3 == scales1) << "scales differ";
      EXPECT_TRUE(out3.bytes == out1.bytes) << "out differs";
      // rejected: scales without codes, codes without scales, a short scale row stride
      p.codes = nullptr;
      EXPECT_EQ(residual_gate_norm_cpu(p), Status::InvalidArgument);
      p.codes = codes3.data();
      p.code_scales = nullptr;
      EXPECT_EQ(residual_gate_norm_cpu(p), Status::InvalidArgument);
      p.code_scales = scales3.data();
      p.ld_scales = rows - 1;
      EXPECT_EQ(residual_gate_norm_cpu(p), Status::InvalidArgument);
    }
}

TEST(NormRef, RejectsBadArguments) {
  std::vector<float> x(64 * 4), y(64 * 4), w(64);
  const auto F = ElemType::F32;
  EXPECT_EQ(rms_norm_cpu(nullptr, F, 64, y.data(), F, 64, w.data(), 4, 64, kEps), Status::InvalidArgument);
  EXPECT_EQ(rms_norm_cpu(x.data(), F, 63, y.data(), F, 64, w.data(), 4, 64, kEps), Status::InvalidArgument);
  EXPECT_EQ(rms_norm_cpu(x.data(), ElemType::I8, 64, y.data(), F, 64, w.data(), 4, 64, kEps), Status::InvalidArgument);
  EXPECT_EQ(rms_norm_cpu(x.data(), F, 64, y.data(), F, 64, w.data(), 4, 0, kEps), Status::InvalidArgument);
  EXPECT_EQ(rms_norm_cpu(x.data(), F, 64, y.data(), F, 64, w.data(), -1, 64, kEps), Status::InvalidArgument);
  EXPECT_EQ(rms_norm_cpu(x.data(), F, 64, y.data(), F, 64, w.data(), 4, 64, -1.f), Status::InvalidArgument);
  EXPECT_EQ(rms_norm_cpu(x.data(), F, 64, y.data(), F, 64, w.data(), 4, 64, NAN), Status::InvalidArgument);
  // same memory, different stride or type: not an in-place call
  EXPECT_EQ(rms_norm_cpu(x.data(), F, 64, x.data(), F, 72, w.data(), 3, 64, kEps), Status::InvalidArgument);
  EXPECT_EQ(rms_norm_cpu(x.data(), F, 64, x.data(), ElemType::BF16, 64, w.data(), 4, 64, kEps), Status::InvalidArgument);
  // zero rows: nothing to do, null pointers allowed
  EXPECT_EQ(rms_norm_cpu(nullptr, F, 0, nullptr, F, 0, nullptr, 0, 64, kEps), Status::Ok);
  EXPECT_EQ(layer_norm_cpu(x.data(), F, 64, nullptr, F, 64, nullptr, nullptr, 4, 64, kEps), Status::InvalidArgument);
  EXPECT_EQ(adaln_modulate_cpu(x.data(), F, 64, y.data(), F, 64, w.data(), w.data(), 0, 0, 4, 64, kEps),
            Status::InvalidArgument);  // rows_per_batch 0
  EXPECT_EQ(adaln_modulate_cpu(x.data(), F, 64, y.data(), F, 64, w.data(), w.data(), 32, 1, 4, 64, kEps),
            Status::InvalidArgument);  // modulation rows overlap (0 < mod_stride < dim)

  ResidualGateNormParams p;
  p.x = x.data();
  p.x_out = x.data();
  p.y = y.data();
  p.out = y.data();
  p.x_stride = p.x_out_stride = p.y_stride = p.out_stride = 64;
  p.residual_type = p.y_type = p.out_type = F;
  p.rows = 4;
  p.dim = 64;
  EXPECT_EQ(residual_gate_norm_check(p), Status::Ok);  // x_out == x and out == y are the allowed aliases
  p.residual_type = ElemType::F16;
  EXPECT_EQ(residual_gate_norm_cpu(p), Status::InvalidArgument);  // residual must be F32 or BF16
  p.residual_type = F;
  p.out = x.data();
  EXPECT_EQ(residual_gate_norm_cpu(p), Status::InvalidArgument);  // out over the residual
  p.out = y.data();
  p.x_out_stride = 72;
  EXPECT_EQ(residual_gate_norm_cpu(p), Status::InvalidArgument);  // x_out == x with another stride
}

}  // namespace
}  // namespace td::kernels
