// The fp32 CPU reference of exact attention (kernels/attention/attention_cpu.cpp)
// against a direct fp64 triple loop, on fresh random inputs in both layouts,
// with len_q != len_kv, strided (packed QKV) inputs, and the LSE. Every GPU
// attention test trusts this reference, so it is checked tightly here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "harness/harness.h"
#include "kernels/attention/attention.h"

namespace td {
namespace {

using kernels::AttnLayout;
using kernels::AttnProblem;
using kernels::AttnStrides;
using kernels::ElemType;
using kernels::Status;

// Elements a strided Q/K/V/O buffer must hold.
size_t span(const AttnStrides& s, int64_t batch, int64_t heads, int64_t len, int64_t dim) {
  return size_t((batch - 1) * s.batch + (heads - 1) * s.head + (len - 1) * s.token + dim);
}

int64_t offset(const AttnStrides& s, int64_t b, int64_t h, int64_t t) { return b * s.batch + h * s.head + t * s.token; }

// Host buffer of `n` elements of `type` with N(0, 1) values (rounded to the type),
// and the same values as float.
struct HostBuf {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
  ElemType type;
  const void* data() const { return bytes.data(); }
};

HostBuf random_buf(size_t n, ElemType type, float stddev = 1.f) {
  HostBuf b;
  b.type = type;
  b.values = test::randn(n, 0.f, stddev);
  b.bytes.resize(n * (type == ElemType::F32 ? 4 : 2));
  for (size_t i = 0; i < n; ++i) {
    if (type == ElemType::F32) {
      std::memcpy(b.bytes.data() + 4 * i, &b.values[i], 4);
    } else {
      const uint16_t h = type == ElemType::BF16 ? f32_to_bf16(b.values[i]) : f32_to_f16(b.values[i]);
      b.values[i] = type == ElemType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      std::memcpy(b.bytes.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

void sync_bytes(HostBuf& b) {  // after editing values: write them back, rounded
  for (size_t i = 0; i < b.values.size(); ++i) {
    if (b.type == ElemType::F32) {
      std::memcpy(b.bytes.data() + 4 * i, &b.values[i], 4);
    } else {
      const uint16_t h = b.type == ElemType::BF16 ? f32_to_bf16(b.values[i]) : f32_to_f16(b.values[i]);
      b.values[i] = b.type == ElemType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      std::memcpy(b.bytes.data() + 2 * i, &h, 2);
    }
  }
}

// The direct definition in fp64: O and LSE in logical [B, H, L, D] / [B, H, L] order.
void attention_fp64(const AttnProblem& p, const std::vector<float>& q, const std::vector<float>& k,
                    const std::vector<float>& v, std::vector<double>& o, std::vector<double>& lse) {
  o.assign(size_t(p.batch * p.heads * p.len_q * p.head_dim), 0.0);
  lse.assign(size_t(p.batch * p.heads * p.len_q), 0.0);
  std::vector<double> s(size_t(p.len_kv));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.len_q; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < p.len_kv; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < p.head_dim; ++c)
            acc += double(q[size_t(offset(p.q, b, h, i) + c)]) * double(k[size_t(offset(p.k, b, h, j) + c)]);
          s[size_t(j)] = double(p.scale) * acc;
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < p.len_kv; ++j) sum += std::exp(s[size_t(j)] - mx);
        const size_t row = size_t(((b * p.heads + h) * p.len_q + i));
        for (int64_t j = 0; j < p.len_kv; ++j) {
          const double w = std::exp(s[size_t(j)] - mx) / sum;
          for (int64_t c = 0; c < p.head_dim; ++c)
            o[row * size_t(p.head_dim) + size_t(c)] += w * double(v[size_t(offset(p.v, b, h, j) + c)]);
        }
        lse[row] = mx + std::log(sum);
      }
}

// O of a reference call, gathered into logical [B, H, L, D] order as double.
std::vector<double> gather_o(const AttnProblem& p, const std::vector<uint8_t>& o) {
  std::vector<double> out;
  out.reserve(size_t(p.batch * p.heads * p.len_q * p.head_dim));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.len_q; ++i)
        for (int64_t c = 0; c < p.head_dim; ++c) {
          const int64_t idx = offset(p.o, b, h, i) + c;
          if (p.o_type == ElemType::F32) {
            float f;
            std::memcpy(&f, o.data() + 4 * idx, 4);
            out.push_back(f);
          } else {
            uint16_t u;
            std::memcpy(&u, o.data() + 2 * idx, 2);
            out.push_back(p.o_type == ElemType::BF16 ? bf16_to_f32(u) : f16_to_f32(u));
          }
        }
  return out;
}

struct RefResult {
  test::Accuracy acc;
  double lse_max_abs = 0;
  size_t lse_nonfinite = 0;
};

// Runs the reference on random inputs of `p` (strides as given, buffers sized
// to fit) and compares with the fp64 loop.
RefResult run_against_fp64(const AttnProblem& p, float stddev = 1.f) {
  const size_t nq = span(p.q, p.batch, p.heads, p.len_q, p.head_dim);
  const size_t nk = span(p.k, p.batch, p.heads, p.len_kv, p.head_dim);
  const size_t nv = span(p.v, p.batch, p.heads, p.len_kv, p.head_dim);
  const size_t no = span(p.o, p.batch, p.heads, p.len_q, p.head_dim);
  HostBuf q = random_buf(nq, p.qkv_type, stddev), k = random_buf(nk, p.qkv_type, stddev),
          v = random_buf(nv, p.qkv_type);
  std::vector<uint8_t> o(no * (p.o_type == ElemType::F32 ? 4 : 2));
  test::poison(o.data(), o.size(), p.o_type == ElemType::F32 ? DType::F32 : DType::BF16);
  std::vector<float> lse(size_t(kernels::attention_lse_count(p)));
  test::poison(lse.data(), lse.size() * 4, DType::F32);
  EXPECT_EQ(kernels::attention_cpu(p, q.data(), k.data(), v.data(), o.data(), lse.data()), Status::Ok)
      << kernels::attention_last_error();
  std::vector<double> ref_o, ref_lse;
  attention_fp64(p, q.values, k.values, v.values, ref_o, ref_lse);
  RefResult r;
  r.acc = test::compare(gather_o(p, o), ref_o);
  for (size_t i = 0; i < lse.size(); ++i) {
    if (!std::isfinite(lse[i])) ++r.lse_nonfinite;
    else r.lse_max_abs = std::max(r.lse_max_abs, std::abs(double(lse[i]) - ref_lse[i]));
  }
  return r;
}

// fp32 arithmetic with fp64 row sums: errors of a few fp32 ulps.
constexpr double kF32RelL2 = 2e-6;
constexpr double kF32Cos = 0.9999999;
constexpr double kLseAbs = 2e-5;

TEST(AttentionRef, MatchesFp64BothLayoutsRaggedLengths) {
  struct Size { int64_t b, h, lq, lk, d; };
  const Size sizes[] = {{1, 1, 1, 1, 8}, {2, 3, 5, 19, 16}, {1, 2, 37, 7, 13}, {3, 1, 17, 33, 64}, {1, 2, 40, 40, 128}};
  for (AttnLayout layout : {AttnLayout::BLHD, AttnLayout::BHLD})
    for (const Size& s : sizes) {
      SCOPED_TRACE(std::string(layout == AttnLayout::BLHD ? "BLHD" : "BHLD") + " B=" + std::to_string(s.b) +
                   " H=" + std::to_string(s.h) + " Lq=" + std::to_string(s.lq) + " Lk=" + std::to_string(s.lk) +
                   " D=" + std::to_string(s.d));
      const AttnProblem p = AttnProblem::make(layout, s.b, s.h, s.lq, s.lk, s.d, ElemType::F32);
      const RefResult r = run_against_fp64(p);
      TD_EXPECT_CLOSE(r.acc, kF32RelL2, kF32Cos);
      EXPECT_EQ(r.lse_nonfinite, 0u);
      EXPECT_LE(r.lse_max_abs, kLseAbs);
    }
}

TEST(AttentionRef, Bf16InputsAndBf16Output) {
  // BF16 in, F32 out: only the reference's own fp32 arithmetic differs from fp64.
  AttnProblem p = AttnProblem::make(AttnLayout::BLHD, 2, 3, 29, 45, 64, ElemType::BF16);
  p.o_type = ElemType::F32;
  RefResult r = run_against_fp64(p);
  TD_EXPECT_CLOSE(r.acc, kF32RelL2, kF32Cos);
  EXPECT_LE(r.lse_max_abs, kLseAbs);
  // BF16 out adds one rounding to 8 mantissa bits (relative 2^-9 per element at most).
  p.o_type = ElemType::BF16;
  r = run_against_fp64(p);
  TD_EXPECT_CLOSE(r.acc, 3e-3, 0.99999);
  EXPECT_LE(r.lse_max_abs, kLseAbs);
}

TEST(AttentionRef, PackedQkvAndPaddedOutputStrides) {
  // Q, K, V as slices of one [B, L, 3, H, D] buffer (a fused QKV projection),
  // O with padded token rows; the reference reads and writes through the strides.
  const int64_t B = 2, H = 3, L = 23, D = 32;
  AttnProblem p = AttnProblem::make(AttnLayout::BLHD, B, H, L, L, D, ElemType::BF16);
  const AttnStrides packed{L * 3 * H * D, D, 3 * H * D};
  p.q = p.k = p.v = packed;
  p.o = {L * (H * D + 24), D, H * D + 24};
  p.o_type = ElemType::F32;
  const size_t n = span(packed, B, H, L, D) + 2 * H * D;
  HostBuf qkv = random_buf(n, ElemType::BF16);
  const auto* base = static_cast<const uint8_t*>(qkv.data());
  std::vector<uint8_t> o((span(p.o, B, H, L, D) + 24) * 4);  // + the last row's padding
  test::poison(o.data(), o.size(), DType::F32);
  std::vector<float> lse(size_t(kernels::attention_lse_count(p)));
  ASSERT_EQ(kernels::attention_cpu(p, base, base + 2 * H * D, base + 4 * H * D, o.data(), lse.data()), Status::Ok)
      << kernels::attention_last_error();
  // The fp64 loop sees the same strides, with K and V shifted by H*D and 2*H*D elements.
  std::vector<float> kv(qkv.values.begin() + H * D, qkv.values.end());
  std::vector<float> vv(qkv.values.begin() + 2 * H * D, qkv.values.end());
  std::vector<double> ref_o, ref_lse;
  attention_fp64(p, qkv.values, kv, vv, ref_o, ref_lse);
  TD_EXPECT_CLOSE(test::compare(gather_o(p, o), ref_o), kF32RelL2, kF32Cos);
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], ref_lse[i], kLseAbs) << "row " << i;
  // The padding between O rows is untouched (still NaN).
  size_t untouched = 0, padding = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t e = H * D; e < H * D + 24; ++e) {
        float f;
        std::memcpy(&f, o.data() + 4 * (b * p.o.batch + t * p.o.token + e), 4);
        ++padding;
        untouched += std::isnan(f);
      }
  EXPECT_EQ(untouched, padding);
}

TEST(AttentionRef, LargeLogitsAndSharedKeyOffset) {
  // Structured inputs like DiT activations: a few channels 16x larger in Q and K
  // and one offset vector added to every key. Logits pass 90: exp() of them
  // without the max subtracted would overflow fp32 (ln FLT_MAX = 88.7).
  const int64_t B = 1, H = 2, Lq = 31, Lk = 53, D = 64;
  AttnProblem p = AttnProblem::make(AttnLayout::BHLD, B, H, Lq, Lk, D, ElemType::F32);
  HostBuf q = random_buf(size_t(B * H * Lq * D), ElemType::F32);
  HostBuf k = random_buf(size_t(B * H * Lk * D), ElemType::F32);
  HostBuf v = random_buf(size_t(B * H * Lk * D), ElemType::F32);
  const std::vector<float> shift = test::randn(size_t(D), 0.f, 3.f);
  for (int64_t r = 0; r < B * H * Lq; ++r)
    for (int64_t c : {3, 17, 40}) q.values[size_t(r * D + c)] *= 16.f;
  for (int64_t r = 0; r < B * H * Lk; ++r) {
    for (int64_t c : {3, 17, 40}) k.values[size_t(r * D + c)] *= 16.f;
    for (int64_t c = 0; c < D; ++c) k.values[size_t(r * D + c)] += shift[size_t(c)];
  }
  sync_bytes(q);
  sync_bytes(k);
  std::vector<float> o(size_t(B * H * Lq * D), NAN), lse(size_t(B * H * Lq), NAN);
  ASSERT_EQ(kernels::attention_cpu(p, q.data(), k.data(), v.data(), o.data(), lse.data()), Status::Ok);
  std::vector<double> ref_o, ref_lse;
  attention_fp64(p, q.values, k.values, v.values, ref_o, ref_lse);
  // Logits of magnitude ~100 carry fp32 rounding of ~3e-5 absolute into exp().
  TD_EXPECT_CLOSE(test::compare(std::vector<double>(o.begin(), o.end()), ref_o), 1e-4, 0.999999);
  double max_lse = 0, worst = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    max_lse = std::max(max_lse, std::abs(ref_lse[i]));
    worst = std::max(worst, std::abs(double(lse[i]) - ref_lse[i]));
  }
  EXPECT_GT(max_lse, 90.0) << "inputs not as large as intended";
  EXPECT_LE(worst, 1e-4 * max_lse);
}

TEST(AttentionRef, SingleKeyCopiesValueRow) {
  // With one key the softmax weight is exactly 1: O is V's row, LSE the logit.
  const int64_t H = 3, Lq = 9, D = 24;
  AttnProblem p = AttnProblem::make(AttnLayout::BLHD, 1, H, Lq, 1, D, ElemType::F32);
  HostBuf q = random_buf(size_t(H * Lq * D), ElemType::F32), k = random_buf(size_t(H * D), ElemType::F32),
          v = random_buf(size_t(H * D), ElemType::F32);
  std::vector<float> o(size_t(H * Lq * D), NAN), lse(size_t(H * Lq), NAN);
  ASSERT_EQ(kernels::attention_cpu(p, q.data(), k.data(), v.data(), o.data(), lse.data()), Status::Ok);
  for (int64_t i = 0; i < Lq; ++i)
    for (int64_t h = 0; h < H; ++h) {
      double logit = 0;
      for (int64_t c = 0; c < D; ++c) {
        EXPECT_EQ(o[size_t((i * H + h) * D + c)], v.values[size_t(h * D + c)]);
        logit += double(q.values[size_t((i * H + h) * D + c)]) * k.values[size_t(h * D + c)];
      }
      EXPECT_NEAR(lse[size_t(h * Lq + i)], logit * p.scale, 1e-5);
    }
}

TEST(AttentionRef, LongSequenceSampledRows) {
  // L ~ 2000 runs in about a second on two cores; 40 random rows are checked
  // against fp64 (the full fp64 loop would be the slow part).
  const int64_t H = 2, L = 2011, D = 64;
  AttnProblem p = AttnProblem::make(AttnLayout::BLHD, 1, H, L, L, D, ElemType::BF16);
  p.o_type = ElemType::F32;
  HostBuf q = random_buf(size_t(L * H * D), ElemType::BF16), k = random_buf(size_t(L * H * D), ElemType::BF16),
          v = random_buf(size_t(L * H * D), ElemType::BF16);
  std::vector<float> o(size_t(L * H * D), NAN), lse(size_t(H * L), NAN);
  ASSERT_EQ(kernels::attention_cpu(p, q.data(), k.data(), v.data(), o.data(), lse.data()), Status::Ok);
  std::uniform_int_distribution<int64_t> pick(0, L - 1);
  std::vector<double> got, want;
  for (int n = 0; n < 40; ++n) {
    const int64_t i = pick(test::rng()), h = n % H;
    std::vector<double> s(static_cast<size_t>(L));
    double mx = -INFINITY;
    for (int64_t j = 0; j < L; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < D; ++c)
        acc += double(q.values[size_t((i * H + h) * D + c)]) * k.values[size_t((j * H + h) * D + c)];
      s[size_t(j)] = acc * p.scale;
      mx = std::max(mx, s[size_t(j)]);
    }
    double sum = 0;
    for (double x : s) sum += std::exp(x - mx);
    for (int64_t c = 0; c < D; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < L; ++j) acc += std::exp(s[size_t(j)] - mx) * v.values[size_t((j * H + h) * D + c)];
      want.push_back(acc / sum);
      got.push_back(o[size_t((i * H + h) * D + c)]);
    }
    EXPECT_NEAR(lse[size_t(h * L + i)], mx + std::log(sum), kLseAbs) << "row " << i << " head " << h;
  }
  TD_EXPECT_CLOSE(test::compare(got, want), 1e-5, 0.9999999);
}

TEST(AttentionRef, RejectsBadArguments) {
  const AttnProblem good = AttnProblem::make(AttnLayout::BLHD, 1, 2, 8, 8, 16, ElemType::F32);
  std::vector<float> buf(1024), out(1024);
  auto run = [&](const AttnProblem& p) {
    return kernels::attention_cpu(p, buf.data(), buf.data(), buf.data(), out.data(), nullptr);
  };
  ASSERT_EQ(run(good), Status::Ok);
  EXPECT_STREQ(kernels::attention_last_error(), "");

  AttnProblem p = good;
  p.len_kv = 0;
  EXPECT_EQ(run(p), Status::InvalidArgument);
  EXPECT_NE(std::string(kernels::attention_last_error()).find("len_kv 0"), std::string::npos)
      << kernels::attention_last_error();

  p = good;
  p.k.token = -16;
  EXPECT_EQ(run(p), Status::InvalidArgument);
  EXPECT_NE(std::string(kernels::attention_last_error()).find("K strides"), std::string::npos)
      << kernels::attention_last_error();

  p = good;
  p.scale = -1.f;
  EXPECT_EQ(run(p), Status::InvalidArgument);
  EXPECT_NE(std::string(kernels::attention_last_error()).find("scale"), std::string::npos);
  p.scale = NAN;
  EXPECT_EQ(run(p), Status::InvalidArgument);

  p = good;
  p.qkv_type = ElemType::I8;
  EXPECT_EQ(run(p), Status::InvalidArgument);
  EXPECT_NE(std::string(kernels::attention_last_error()).find("i8"), std::string::npos);

  EXPECT_EQ(kernels::attention_cpu(good, buf.data(), nullptr, buf.data(), out.data(), nullptr),
            Status::InvalidArgument);
  EXPECT_NE(std::string(kernels::attention_last_error()).find("null pointer for K"), std::string::npos)
      << kernels::attention_last_error();
}

TEST(AttentionRef, LayoutStrides) {
  const AttnStrides blhd = kernels::attn_contiguous_strides(AttnLayout::BLHD, 12, 100, 128);
  EXPECT_EQ(blhd.batch, 100 * 12 * 128);
  EXPECT_EQ(blhd.head, 128);
  EXPECT_EQ(blhd.token, 12 * 128);
  const AttnStrides bhld = kernels::attn_contiguous_strides(AttnLayout::BHLD, 12, 100, 128);
  EXPECT_EQ(bhld.batch, 12 * 100 * 128);
  EXPECT_EQ(bhld.head, 100 * 128);
  EXPECT_EQ(bhld.token, 128);
  const AttnProblem p = AttnProblem::make(AttnLayout::BLHD, 2, 12, 100, 512, 128);
  EXPECT_EQ(p.k.batch, 512 * 12 * 128);
  EXPECT_EQ(p.q.batch, 100 * 12 * 128);
  EXPECT_FLOAT_EQ(p.scale, 1.f / std::sqrt(128.f));
}

}  // namespace
}  // namespace td
