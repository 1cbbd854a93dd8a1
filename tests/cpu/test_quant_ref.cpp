// The fp32 CPU references of the INT8 quantizers (src/kernels/quant/*_cpu.cpp)
// against direct fp64 evaluations of their formulas, on fresh random inputs
// of awkward sizes (rows 1, 37, 130, 333, 1000; cols 64, 200, 1000, 1001,
// 1536, 4096, 5120, 8960), every input type, padded row strides, poisoned
// outputs and padding, hand-made ties, saturation and zero groups.
//
// What is checked, per quantization group (128x128 block, 1x128 group, row):
//  * the scale: exactly fl(max(amax, 1e-8) / 128) (TurboDiffusion) or
//    fl(amax / 127) (symmetric), amax taken in fp64 over the stored inputs;
//  * every code against round_half_even(x * range / amax) in fp64, saturated.
//    The reference multiplies in fp32 (x * fl(range/amax), two roundings,
//    relative error < 2^-23), so a code may differ by 1 only where the fp64
//    product lies within 2^-23 * 128 ~ 1.5e-5 of a .5 boundary: we allow +-1
//    inside a window of 1e-4 around the tie — anything else fails. Exact
//    ties are common with 16-bit inputs (a bf16 value has 8 significant bits,
//    so x * 127/amax is exactly k + 0.5 for ~2e-4 of the codes, and for many
//    more in a group whose amax has a short mantissa); fl(range/amax) is not
//    exact, so the fp32 product resolves an exact tie by the sign of its
//    rounding error rather than to even, as TurboDiffusion's kernel does: any
//    number of those may move. Moves at inexact near-ties (fp64 product not
//    exactly k + 0.5) are limited to 1e-4 of the codes (plus 4);
//  * the dequantized value q * scale within half a step of x (a full step
//    where TurboDiffusion's format saturates: x * 128/amax >= 127.5 maps to
//    127), plus 4e-7 |x| for the fp32 product;
//  * for unit Gaussian inputs, the relative L2 error of the dequantized
//    tensor: rounding to a step s is uniform error with rms s / sqrt(12), and
//    s = amax/128 (or /127) with amax <= 5.5 sigma for groups of <= 16384
//    samples (P(max |N(0,1)| > 5.5) over 16384 draws is 6e-4, and the L2 error
//    averages over groups), so rel_l2 <= 5.5 / 127 / sqrt(12) = 0.0125. The
//    typical values are 0.010 (blocks), 0.0066 (1x128 groups).
// The fused LayerNorm-modulate quantizers are checked the same way against
// y computed in fp64, with the fp32 LayerNorm's error (<= 1e-5 (1 + |y|))
// widening the tie window to 2e-3 and allowing 1e-3 of the codes to move by 1.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "harness/harness.h"
#include "kernels/quant/layernorm_modulate_quant.h"
#include "kernels/quant/quant_block128.h"
#include "kernels/quant/quant_per_row.h"
#include "kernels/quant/quant_token128.h"

namespace td::kernels {
namespace {

constexpr ElemType kActTypes[] = {ElemType::F32, ElemType::F16, ElemType::BF16};
constexpr uint8_t kCodePoison = 0x5a;  // what test::poison writes into int8 buffers

DType dtype_of(ElemType t) { return t == ElemType::F32 ? DType::F32 : t == ElemType::F16 ? DType::F16 : DType::BF16; }
const char* type_name(ElemType t) { return t == ElemType::F32 ? "f32" : t == ElemType::F16 ? "f16" : "bf16"; }
size_t elem_bytes(ElemType t) { return t == ElemType::F32 ? 4 : 2; }

// rows x cols activations stored as `type` with row stride ld (padding poisoned).
struct Input {
  ElemType type = ElemType::F32;
  int64_t rows = 0, cols = 0, ld = 0;
  std::vector<unsigned char> bytes;
  double at(int64_t r, int64_t c) const { return load_as_f64(bytes.data(), dtype_of(type), size_t(r * ld + c)); }
};

enum class Dist {
  Gaussian,   // N(0, 1)
  Awkward,    // rows scaled by 2^U(-6, 6), a few zero 128-groups, an outlier per 1000 elements
};

Input make_input(ElemType t, int64_t rows, int64_t cols, int64_t ld, Dist dist) {
  Input in{t, rows, cols, ld, std::vector<unsigned char>(size_t(std::max<int64_t>(rows * ld, 1)) * elem_bytes(t))};
  test::poison(in.bytes.data(), in.bytes.size(), dtype_of(t));
  const std::vector<float> v = test::randn(size_t(rows * cols));
  const std::vector<float> u = test::randu(size_t(rows) + size_t(rows * cols), 0.f, 1.f);
  for (int64_t r = 0; r < rows; ++r) {
    const double row_scale = dist == Dist::Awkward ? std::exp2(12.0 * u[size_t(r)] - 6.0) : 1.0;
    for (int64_t c = 0; c < cols; ++c) {
      double x = v[size_t(r * cols + c)] * row_scale;
      if (dist == Dist::Awkward) {
        if ((r % 7 == 3) && (c / kQuantGroup) % 3 == 1) x = 0;        // zero 1x128 groups (and whole blocks for rows < 7)
        if (u[size_t(rows + r * cols + c)] < 1e-3) x *= 40;            // outliers
      }
      store_from_f64(in.bytes.data(), dtype_of(t), size_t(r * ld + c), x);
    }
  }
  return in;
}

// ---- the formats, as the checks see them -------------------------------------------

enum class Fmt { Block128, Token128, PerRow };
const char* fmt_name(Fmt f) { return f == Fmt::Block128 ? "block128" : f == Fmt::Token128 ? "token128" : "per_row"; }

struct Layout {
  Fmt fmt;
  int64_t rows, cols, ld_q, ld_scales;  // ld_scales: token128 only
};

int64_t group_count(const Layout& l) {
  switch (l.fmt) {
    case Fmt::Block128: return quant_groups(l.rows) * quant_groups(l.cols);
    case Fmt::Token128: return l.rows * quant_groups(l.cols);
    default: return l.rows;
  }
}
// Rows [r0, r1) x columns [c0, c1) of group i, and where its scale is stored.
struct Group {
  int64_t r0, r1, c0, c1, scale_index;
};
Group group_at(const Layout& l, int64_t i) {
  switch (l.fmt) {
    case Fmt::Block128: {
      const int64_t cb = quant_groups(l.cols), rb = i / cb, c = i % cb;
      return {rb * 128, std::min(l.rows, rb * 128 + 128), c * 128, std::min(l.cols, c * 128 + 128), i};
    }
    case Fmt::Token128: {
      const int64_t g = quant_groups(l.cols), r = i / g, c = i % g;
      return {r, r + 1, c * 128, std::min(l.cols, c * 128 + 128), c * l.ld_scales + r};
    }
    default: return {i, i + 1, 0, l.cols, i};
  }
}

double sat_round(double v) { return std::min(127.0, std::max(-128.0, std::nearbyint(v))); }

struct Tolerance {
  double scale_rel = 0;          // |scale - exact| / exact
  double tie_window = 1e-4;      // a +-1 code difference is allowed where |frac(v) - 0.5| < this
  double max_tie_fraction = 1e-4;  // of moves at inexact ties
  double value_slack_rel = 4e-7;  // extra dequantization error allowed, relative to |exact| (+ 1e-6 abs when > 0)
};

struct CheckStats {
  size_t codes = 0, ties_moved = 0, exact_ties_moved = 0;
  double err2 = 0, ref2 = 0;
};

// Checks codes and scales of one quantized tensor against `exact` (fp64
// values of what was quantized): scales, codes (tie rule), dequantization bound.
CheckStats check_quantized(const Layout& l, const std::function<double(int64_t, int64_t)>& exact,
                           const std::vector<int8_t>& q, const std::vector<float>& scales, const Tolerance& tol,
                           const std::string& what) {
  CheckStats st;
  const bool block = l.fmt == Fmt::Block128;
  const double range = block ? 128.0 : 127.0;
  int reported = 0;
  auto report = [&](const std::string& msg) {
    if (reported++ < 8) ADD_FAILURE() << what << ": " << msg;
  };
  for (int64_t gi = 0; gi < group_count(l); ++gi) {
    const Group g = group_at(l, gi);
    double amax = 0;
    for (int64_t r = g.r0; r < g.r1; ++r)
      for (int64_t c = g.c0; c < g.c1; ++c) amax = std::max(amax, std::fabs(exact(r, c)));
    const bool zero_group = !block && amax < double(kSymAmaxMin);
    if (block) amax = std::max(amax, double(kBlockAmaxFloor));
    const double want_scale = zero_group ? 0.0 : amax / range;
    const float scale = scales[size_t(g.scale_index)];
    if (!std::isfinite(scale)) {
      report("scale of group " + std::to_string(gi) + " not written (" + std::to_string(scale) + ")");
      continue;
    }
    if (tol.scale_rel == 0 ? scale != float(want_scale)
                           : std::fabs(scale - want_scale) > tol.scale_rel * want_scale)
      report("group " + std::to_string(gi) + " scale " + std::to_string(scale) + ", want " +
             std::to_string(want_scale));
    for (int64_t r = g.r0; r < g.r1; ++r) {
      for (int64_t c = g.c0; c < g.c1; ++c) {
        const double x = exact(r, c);
        const int code = q[size_t(r * l.ld_q + c)];
        ++st.codes;
        const double v = zero_group ? 0.0 : x * range / amax;
        const double want = sat_round(v);
        if (code != want) {
          const double dist_to_tie = std::fabs(v - std::floor(v) - 0.5);
          if (std::fabs(code - want) == 1 && dist_to_tie == 0)
            ++st.exact_ties_moved;
          else if (std::fabs(code - want) == 1 && dist_to_tie < tol.tie_window)
            ++st.ties_moved;
          else
            report("code at (" + std::to_string(r) + ", " + std::to_string(c) + ") is " + std::to_string(code) +
                   ", want " + std::to_string(want) + " (x " + std::to_string(x) + ", x*range/amax " +
                   std::to_string(v) + ")");
        }
        const double deq = double(code) * double(scale);
        const double step = double(scale);
        const double bound = ((block && v >= 127.5) ? step : 0.5 * step) * (1 + 1e-6) +
                             tol.value_slack_rel * std::fabs(x) + (tol.value_slack_rel > 4e-7 ? 1e-6 : 1e-30);
        if (std::fabs(deq - x) > bound)
          report("dequantized (" + std::to_string(r) + ", " + std::to_string(c) + ") = " + std::to_string(deq) +
                 ", x " + std::to_string(x) + ", error above " + std::to_string(bound));
        st.err2 += (deq - x) * (deq - x);
        st.ref2 += x * x;
      }
    }
  }
  EXPECT_LE(double(st.ties_moved), tol.max_tie_fraction * double(st.codes) + 4)
      << what << ": " << st.ties_moved << " of " << st.codes << " codes moved across an inexact tie ("
      << st.exact_ties_moved << " across exact ties)";
  return st;
}

// The padding of q rows (columns [cols, ld_q)) must still hold the poison.
void expect_q_padding_untouched(const std::vector<int8_t>& q, int64_t rows, int64_t cols, int64_t ld_q,
                                const std::string& what) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = cols; c < ld_q; ++c)
      if (uint8_t(q[size_t(r * ld_q + c)]) != kCodePoison) {
        ADD_FAILURE() << what << ": q padding (" << r << ", " << c << ") was written";
        return;
      }
}

std::vector<int8_t> poisoned_codes(int64_t rows, int64_t ld) {
  std::vector<int8_t> q(size_t(std::max<int64_t>(rows * ld, 1)));
  test::poison(q.data(), q.size(), DType::I8);
  return q;
}
std::vector<float> poisoned_scales(size_t n) {
  std::vector<float> s(std::max<size_t>(n, 1));
  test::poison(s.data(), s.size() * 4, DType::F32);
  return s;
}

// Quantizes `in` with the CPU reference of `fmt` into poisoned buffers.
struct Result {
  Layout layout;
  std::vector<int8_t> q;
  std::vector<float> scales;
};
Result run_reference(Fmt fmt, const Input& in) {
  Result res;
  const int64_t ld_q = in.cols + (in.cols % 2 == 0 ? 8 : 3);  // padded, sometimes odd
  const int64_t ld_scales = fmt == Fmt::Token128 ? in.rows + 3 : 0;
  res.layout = {fmt, in.rows, in.cols, ld_q, ld_scales};
  res.q = poisoned_codes(in.rows, ld_q);
  size_t nscales = fmt == Fmt::Block128   ? size_t(quant_groups(in.rows) * quant_groups(in.cols))
                   : fmt == Fmt::Token128 ? size_t(quant_groups(in.cols) * ld_scales)
                                          : size_t(in.rows);
  res.scales = poisoned_scales(nscales);
  Status st = Status::Ok;
  switch (fmt) {
    case Fmt::Block128:
      st = quantize_block128_cpu(in.type, in.bytes.data(), in.rows, in.cols, in.ld, res.q.data(), ld_q,
                                 res.scales.data());
      break;
    case Fmt::Token128:
      st = quantize_token128_cpu(in.type, in.bytes.data(), in.rows, in.cols, in.ld, res.q.data(), ld_q,
                                 res.scales.data(), ld_scales);
      break;
    case Fmt::PerRow:
      st = quantize_per_row_cpu(in.type, in.bytes.data(), in.rows, in.cols, in.ld, res.q.data(), ld_q,
                                res.scales.data());
      break;
  }
  EXPECT_EQ(st, Status::Ok);
  return res;
}

// Dequantizes with the format's own dequantizer.
std::vector<float> dequantize(const Result& res) {
  const Layout& l = res.layout;
  std::vector<float> out(size_t(l.rows * l.cols), NAN);
  Status st = Status::Ok;
  switch (l.fmt) {
    case Fmt::Block128:
      st = dequantize_block128_cpu(res.q.data(), l.rows, l.cols, l.ld_q, res.scales.data(), out.data(), l.cols);
      break;
    case Fmt::Token128:
      st = dequantize_token128_cpu(res.q.data(), l.rows, l.cols, l.ld_q, res.scales.data(), l.ld_scales, out.data(),
                                   l.cols);
      break;
    case Fmt::PerRow:
      st = dequantize_per_row_cpu(res.q.data(), l.rows, l.cols, l.ld_q, res.scales.data(), out.data(), l.cols);
      break;
  }
  EXPECT_EQ(st, Status::Ok);
  return out;
}

struct Shape {
  int64_t rows, cols;
};
// Awkward shapes: rows not multiples of 32/128, cols below 128, not multiples of 8/128, and Wan's widths.
constexpr Shape kShapes[] = {{1, 8960}, {37, 1536}, {333, 5120}, {1000, 200}, {130, 4096},
                             {257, 1000}, {37, 64}, {3, 1001}, {129, 129}};

void check_format_against_fp64(Fmt fmt) {
  for (ElemType t : kActTypes) {
    for (const Shape& s : kShapes) {
      for (Dist dist : {Dist::Gaussian, Dist::Awkward}) {
        const int64_t ld = s.cols + (s.cols % 2 ? 2 : 16);
        const Input in = make_input(t, s.rows, s.cols, ld, dist);
        const Result res = run_reference(fmt, in);
        const std::string what = std::string(fmt_name(fmt)) + " " + type_name(t) + " " + std::to_string(s.rows) +
                                 "x" + std::to_string(s.cols) + (dist == Dist::Gaussian ? " gaussian" : " awkward");
        const CheckStats st =
            check_quantized(res.layout, [&](int64_t r, int64_t c) { return in.at(r, c); }, res.q, res.scales,
                            Tolerance{}, what);
        expect_q_padding_untouched(res.q, s.rows, s.cols, res.layout.ld_q, what);
        if (fmt == Fmt::Token128) {  // scale padding entries (rows .. ld_scales) stay poisoned
          for (int64_t g = 0; g < quant_groups(s.cols); ++g)
            for (int64_t r = s.rows; r < res.layout.ld_scales; ++r)
              ASSERT_TRUE(std::isnan(res.scales[size_t(g * res.layout.ld_scales + r)])) << what << " scale padding";
        }
        // The dequantizer agrees with q * scale as checked above, and the L2 error is what INT8 allows.
        const std::vector<float> deq = dequantize(res);
        std::vector<double> out(deq.begin(), deq.end()), ref(deq.size());
        for (int64_t r = 0; r < s.rows; ++r)
          for (int64_t c = 0; c < s.cols; ++c) ref[size_t(r * s.cols + c)] = in.at(r, c);
        const test::Accuracy acc = test::compare(out, ref);
        EXPECT_NEAR(acc.rel_l2, std::sqrt(st.err2 / st.ref2), 1e-6) << what << " dequantizer";
        if (dist == Dist::Gaussian) {
          TD_EXPECT_CLOSE(acc, 0.0125, 0.9999);
        } else {
          EXPECT_EQ(acc.nonfinite, 0u) << what;
        }
      }
    }
  }
}

TEST(QuantBlock128Ref, MatchesFp64FormulaOnAwkwardShapesAndTypes) { check_format_against_fp64(Fmt::Block128); }
TEST(QuantToken128Ref, MatchesFp64FormulaOnAwkwardShapesAndTypes) { check_format_against_fp64(Fmt::Token128); }
TEST(QuantPerRowRef, MatchesFp64FormulaOnAwkwardShapesAndTypes) { check_format_against_fp64(Fmt::PerRow); }

// ---- hand-made ties, saturation and zero groups ---------------------------------------

// A 2 x 130 fp32 matrix whose first block has amax exactly 128, so the block
// multiplier 128/amax is exactly 1 and the codes are the rounded inputs.
TEST(QuantBlock128Ref, TurboDiffusionTiesSaturationAndZeroBlock) {
  const int64_t rows = 2, cols = 130;
  std::vector<float> x(size_t(rows * cols), 0.f);
  const float row0[] = {2.5f, 3.5f, -2.5f, -3.5f, 0.5f, 1.5f, -0.5f, 127.5f, -128.f, 127.49f, 126.5f, 100.25f};
  for (size_t i = 0; i < std::size(row0); ++i) x[i] = row0[i];
  x[size_t(cols) + 5] = 64.f;  // row 1 of the first block
  // columns 128, 129: the second block (ragged, 2 columns) stays all zero
  std::vector<int8_t> q = poisoned_codes(rows, cols);
  std::vector<float> scales = poisoned_scales(2);
  ASSERT_EQ(quantize_block128_cpu(ElemType::F32, x.data(), rows, cols, cols, q.data(), cols, scales.data()),
            Status::Ok);
  EXPECT_EQ(scales[0], 1.0f);                   // 128 / 128
  const int want0[] = {2, 4, -2, -4, 0, 2, 0, 127, -128, 127, 126, 100};  // half to even; 127.5 -> 128 saturates to 127
  for (size_t i = 0; i < std::size(want0); ++i) EXPECT_EQ(q[i], want0[i]) << "x = " << row0[i];
  EXPECT_EQ(q[size_t(cols) + 5], 64);
  EXPECT_EQ(scales[1], 1e-8f / 128.f);  // TurboDiffusion's floor: amax starts at 1e-8
  EXPECT_EQ(scales[1], 7.8125e-11f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 128; c < cols; ++c) EXPECT_EQ(q[size_t(r * cols + c)], 0);
}

TEST(QuantToken128Ref, TiesAndZeroGroups) {
  // One row, three groups: amax 127 (multiplier exactly 1), all zeros, and a
  // ragged group of 4 whose amax is 2^-110 (below 2^-100: treated as zero).
  const int64_t cols = 260;
  std::vector<float> x(size_t(cols), 0.f);
  const float g0[] = {2.5f, -2.5f, 3.5f, -126.5f, 127.f, -127.f, 0.5f, 1.49f};
  for (size_t i = 0; i < std::size(g0); ++i) x[i] = g0[i];
  x[256] = std::ldexp(1.f, -110), x[259] = -std::ldexp(1.f, -111);
  std::vector<int8_t> q = poisoned_codes(1, cols);
  std::vector<float> scales = poisoned_scales(3);
  ASSERT_EQ(quantize_token128_cpu(ElemType::F32, x.data(), 1, cols, cols, q.data(), cols, scales.data(), 1),
            Status::Ok);
  EXPECT_EQ(scales[0], 1.0f);
  const int want[] = {2, -2, 4, -126, 127, -127, 0, 1};
  for (size_t i = 0; i < std::size(want); ++i) EXPECT_EQ(q[i], want[i]) << "x = " << g0[i];
  EXPECT_EQ(scales[1], 0.f);
  EXPECT_EQ(scales[2], 0.f);
  for (int64_t c = 128; c < cols; ++c) EXPECT_EQ(q[size_t(c)], 0) << c;

  // The same row per row: one scale, 127 / 127.
  std::vector<float> row_scale = poisoned_scales(1);
  ASSERT_EQ(quantize_per_row_cpu(ElemType::F32, x.data(), 1, cols, cols, q.data(), cols, row_scale.data()), Status::Ok);
  EXPECT_EQ(row_scale[0], 1.0f);
  for (size_t i = 0; i < std::size(want); ++i) EXPECT_EQ(q[i], want[i]);
  std::vector<float> zeros(64, 0.f);
  ASSERT_EQ(quantize_per_row_cpu(ElemType::F32, zeros.data(), 1, 64, 64, q.data(), 64, row_scale.data()), Status::Ok);
  EXPECT_EQ(row_scale[0], 0.f);
}

TEST(QuantRef, BadArgumentsAndEmptyInputs) {
  std::vector<float> x(64, 1.f), s(4, 0.f);
  std::vector<int8_t> q(64);
  EXPECT_EQ(quantize_block128_cpu(ElemType::F32, x.data(), 2, 32, 16, q.data(), 32, s.data()), Status::InvalidArgument);
  EXPECT_EQ(quantize_block128_cpu(ElemType::I8, x.data(), 2, 32, 32, q.data(), 32, s.data()), Status::InvalidArgument);
  EXPECT_EQ(quantize_block128_cpu(ElemType::F32, nullptr, 2, 32, 32, q.data(), 32, s.data()), Status::InvalidArgument);
  EXPECT_EQ(quantize_token128_cpu(ElemType::F32, x.data(), 2, 32, 32, q.data(), 32, s.data(), 1), Status::InvalidArgument);
  EXPECT_EQ(quantize_per_row_cpu(ElemType::F32, x.data(), -1, 32, 32, q.data(), 32, s.data()), Status::InvalidArgument);
  // Empty problems succeed without touching anything (null pointers allowed).
  EXPECT_EQ(quantize_block128_cpu(ElemType::BF16, nullptr, 0, 32, 32, nullptr, 32, nullptr), Status::Ok);
  EXPECT_EQ(quantize_token128_cpu(ElemType::F16, nullptr, 5, 0, 0, nullptr, 0, nullptr, 5), Status::Ok);
  EXPECT_EQ(quantize_per_row_cpu(ElemType::F32, nullptr, 0, 0, 0, nullptr, 0, nullptr), Status::Ok);
}

// ---- fused LayerNorm + modulation + quantization ---------------------------------------

struct LnCase {
  int64_t rows, dim, rows_per_batch;
};
constexpr LnCase kLnCases[] = {{1, 1536, 1}, {37, 64, 37}, {333, 1000, 111}, {130, 5120, 65}, {129, 200, 43},
                               {20, 1001, 7}};
constexpr float kEps = 1e-6f;

// Wan-style modulation: e0 [batch, 6, dim]; shift = e0[:, 0], scale = e0[:, 1].
struct Modulation {
  std::vector<float> e0;
  int64_t ld = 0;
  const float* shift() const { return e0.data(); }
  const float* scale() const { return e0.data() + ld / 6; }
};
Modulation make_modulation(int64_t batches, int64_t dim) {
  Modulation m;
  m.ld = 6 * dim;
  m.e0 = test::randn(size_t(batches * m.ld), 0.f, 0.4f);
  return m;
}

// fp64 LayerNorm-modulate of the stored inputs.
std::vector<double> ln_modulate_fp64(const Input& in, const Modulation& mod, int64_t rows_per_batch) {
  std::vector<double> y(size_t(in.rows * in.cols));
  for (int64_t r = 0; r < in.rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < in.cols; ++c) mean += in.at(r, c);
    mean /= double(in.cols);
    for (int64_t c = 0; c < in.cols; ++c) var += (in.at(r, c) - mean) * (in.at(r, c) - mean);
    var /= double(in.cols);
    const double rstd = 1.0 / std::sqrt(var + double(kEps));
    const int64_t b = r / rows_per_batch;
    for (int64_t c = 0; c < in.cols; ++c) {
      const double sh = mod.shift()[b * mod.ld + c], sc = mod.scale()[b * mod.ld + c];
      y[size_t(r * in.cols + c)] = (in.at(r, c) - mean) * rstd * (1.0 + sc) + sh;
    }
  }
  return y;
}

void check_ln_quant(Fmt fmt) {
  for (ElemType t : kActTypes) {
    for (const LnCase& lc : kLnCases) {
      const std::string what = std::string("ln_modulate_quant ") + fmt_name(fmt) + " " + type_name(t) + " " +
                               std::to_string(lc.rows) + "x" + std::to_string(lc.dim);
      // Mean 3, std 2: the two-pass variance matters.
      Input in = make_input(t, lc.rows, lc.dim, lc.dim + 8, Dist::Gaussian);
      for (int64_t r = 0; r < lc.rows; ++r)
        for (int64_t c = 0; c < lc.dim; ++c)
          store_from_f64(in.bytes.data(), dtype_of(t), size_t(r * in.ld + c), 3.0 + 2.0 * in.at(r, c));
      const int64_t batches = (lc.rows + lc.rows_per_batch - 1) / lc.rows_per_batch;
      const Modulation mod = make_modulation(batches, lc.dim);
      const std::vector<double> y64 = ln_modulate_fp64(in, mod, lc.rows_per_batch);

      // The unfused reference against fp64.
      std::vector<float> y32(size_t(lc.rows * lc.dim), NAN);
      ASSERT_EQ(layernorm_modulate_f32_cpu(t, in.bytes.data(), lc.rows, lc.dim, in.ld, mod.shift(), mod.scale(), mod.ld,
                                           lc.rows_per_batch, kEps, y32.data(), lc.dim),
                Status::Ok);
      for (size_t i = 0; i < y32.size(); ++i)
        ASSERT_LE(std::fabs(y32[i] - y64[i]), 1e-5 * (1 + std::fabs(y64[i]))) << what << " y at " << i;

      const Layout l{fmt, lc.rows, lc.dim, lc.dim + 16, fmt == Fmt::Token128 ? lc.rows + 1 : 0};
      std::vector<int8_t> q = poisoned_codes(lc.rows, l.ld_q);
      std::vector<float> scales = poisoned_scales(fmt == Fmt::Token128 ? size_t(quant_groups(lc.dim) * l.ld_scales)
                                                                       : size_t(quant_groups(lc.rows) * quant_groups(lc.dim)));
      const Status st =
          fmt == Fmt::Token128
              ? layernorm_modulate_quant_token128_cpu(t, in.bytes.data(), lc.rows, lc.dim, in.ld, mod.shift(),
                                                      mod.scale(), mod.ld, lc.rows_per_batch, kEps, q.data(), l.ld_q,
                                                      scales.data(), l.ld_scales)
              : layernorm_modulate_quant_block128_cpu(t, in.bytes.data(), lc.rows, lc.dim, in.ld, mod.shift(),
                                                      mod.scale(), mod.ld, lc.rows_per_batch, kEps, q.data(), l.ld_q,
                                                      scales.data());
      ASSERT_EQ(st, Status::Ok) << what;
      Tolerance tol;
      tol.scale_rel = 2e-5;
      tol.tie_window = 2e-3;
      tol.max_tie_fraction = 1e-3;
      tol.value_slack_rel = 1e-5;
      check_quantized(l, [&](int64_t r, int64_t c) { return y64[size_t(r * lc.dim + c)]; }, q, scales, tol, what);
      expect_q_padding_untouched(q, lc.rows, lc.dim, l.ld_q, what);

      // It is the composition: the unfused y quantized by the standalone reference, bit for bit.
      std::vector<int8_t> q2 = poisoned_codes(lc.rows, l.ld_q);
      std::vector<float> s2 = poisoned_scales(scales.size());
      const Status st2 = fmt == Fmt::Token128
                             ? quantize_token128_cpu(ElemType::F32, y32.data(), lc.rows, lc.dim, lc.dim, q2.data(),
                                                     l.ld_q, s2.data(), l.ld_scales)
                             : quantize_block128_cpu(ElemType::F32, y32.data(), lc.rows, lc.dim, lc.dim, q2.data(),
                                                     l.ld_q, s2.data());
      ASSERT_EQ(st2, Status::Ok) << what;
      EXPECT_EQ(std::memcmp(q.data(), q2.data(), q.size()), 0) << what;
      for (size_t i = 0; i < scales.size(); ++i) {
        if (!(std::isnan(scales[i]) && std::isnan(s2[i]))) ASSERT_EQ(scales[i], s2[i]) << what << " scale " << i;
      }
    }
  }
}

TEST(LnModulateQuantRef, Token128MatchesFp64AndIsTheComposition) { check_ln_quant(Fmt::Token128); }
TEST(LnModulateQuantRef, Block128MatchesFp64AndIsTheComposition) { check_ln_quant(Fmt::Block128); }

TEST(LnModulateQuantRef, BadArguments) {
  std::vector<float> x(64, 1.f), mod(64, 0.f), s(4);
  std::vector<int8_t> q(64);
  EXPECT_EQ(layernorm_modulate_quant_token128_cpu(ElemType::F32, x.data(), 2, 32, 32, mod.data(), mod.data(), 32, 0,
                                                  kEps, q.data(), 32, s.data(), 2),
            Status::InvalidArgument);  // rows_per_batch 0
  EXPECT_EQ(layernorm_modulate_quant_block128_cpu(ElemType::F32, x.data(), 2, 32, 32, mod.data(), mod.data(), 16, 1,
                                                  kEps, q.data(), 32, s.data()),
            Status::InvalidArgument);  // ld_mod < dim
  EXPECT_EQ(layernorm_modulate_quant_token128_cpu(ElemType::F32, x.data(), 2, 32, 32, mod.data(), mod.data(), 32, 1,
                                                  kEps, q.data(), 32, s.data(), 1),
            Status::InvalidArgument);  // ld_scales < rows
}

}  // namespace
}  // namespace td::kernels
