// The W8A8 GEMM CPU references (kernels/gemm/int8_gemm.h) against a direct
// fp64 computation written here: both operands dequantized to double with their
// scale formulas, one dot product per output, the epilogue in double. The
// references sum int8 products exactly and scale in fp32 (or fp64), so the fp32
// reference sits within ~1e-7 relative of the direct result; the bar is 1e-6.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "harness/harness.h"
#include "kernels/gemm/int8_gemm.h"

namespace td::kernels {
namespace {

constexpr int64_t kBlk = 128;
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

enum class Scheme { PostScale, Token128, Block128 };

struct EpilogueCase {
  bool bias = false;
  bool gelu = false;
  bool residual = false;
  bool gate = false;
  bool in_place = false;  // out aliases the residual
  int64_t rows_per_batch = 0;
};

// One random problem in host memory, with padded leading dimensions so that
// an implementation reading past a row's end or ignoring ld shows up.
struct Problem {
  Scheme scheme;
  int64_t M, N, K, lda, ldw, ldo, ld_a_scale = 0, ld_w_scale = 0;
  std::vector<int8_t> a, w;
  std::vector<float> a_scale, w_scale, bias, gate;
  std::vector<uint16_t> residual;
  int64_t ld_residual = 0, ld_gate = 0;
  EpilogueCase epi;

  Problem(Scheme s, int64_t m, int64_t n, int64_t k, EpilogueCase e) : scheme(s), M(m), N(n), K(k), epi(e) {
    lda = K + 16;
    ldw = K + 32;
    ldo = N + 8;
    auto& g = test::rng();
    std::uniform_int_distribution<int> codes(-128, 127);
    a.resize(size_t(M * lda));
    w.resize(size_t(N * ldw));
    for (auto& v : a) v = int8_t(codes(g));
    for (auto& v : w) v = int8_t(codes(g));
    const int64_t kb = cdiv(K, kBlk);
    // scales around 1/127 (a unit-range operand) with a 4x spread
    switch (scheme) {
      case Scheme::PostScale:
        a_scale = test::randu(size_t(M), 0.5f / 127, 2.f / 127);
        w_scale = test::randu(size_t(N), 0.5f / 127, 2.f / 127);
        break;
      case Scheme::Token128:
        ld_a_scale = M + 3;
        a_scale = test::randu(size_t(kb * ld_a_scale), 0.5f / 127, 2.f / 127);
        break;
      case Scheme::Block128:
        ld_a_scale = kb + 1;
        a_scale = test::randu(size_t(cdiv(M, kBlk) * ld_a_scale), 0.5f / 127, 2.f / 127);
        break;
    }
    if (scheme != Scheme::PostScale) {
      ld_w_scale = kb + 2;
      w_scale = test::randu(size_t(cdiv(N, kBlk) * ld_w_scale), 0.5f / 127, 2.f / 127);
    }
    if (epi.bias) bias = test::randn(size_t(N), 0.f, 2.f);
    if (epi.residual) {
      ld_residual = N + 8;
      residual.resize(size_t(M * ld_residual));
      const auto r = test::randn(residual.size(), 0.f, 4.f);
      for (size_t i = 0; i < r.size(); ++i) residual[i] = f32_to_bf16(r[i]);
    }
    if (epi.gate) {
      ld_gate = N + 4;
      gate = test::randn(size_t(cdiv(M, epi.rows_per_batch) * ld_gate), 0.f, 1.f);
    }
  }

  double sa(int64_t m, int64_t k) const {
    switch (scheme) {
      case Scheme::PostScale: return a_scale[size_t(m)];
      case Scheme::Token128: return a_scale[size_t((k / kBlk) * ld_a_scale + m)];
      case Scheme::Block128: return a_scale[size_t((m / kBlk) * ld_a_scale + k / kBlk)];
    }
    return 0;
  }
  double sw(int64_t n, int64_t k) const {
    if (scheme == Scheme::PostScale) return w_scale[size_t(n)];
    return w_scale[size_t((n / kBlk) * ld_w_scale + k / kBlk)];
  }

  // Direct fp64: dequantize, multiply, epilogue. [M, N] dense.
  std::vector<double> direct() const {
    std::vector<double> ad(size_t(M * K)), wd(size_t(N * K));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) ad[size_t(m * K + k)] = double(a[size_t(m * lda + k)]) * sa(m, k);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) wd[size_t(n * K + k)] = double(w[size_t(n * ldw + k)]) * sw(n, k);
    std::vector<double> out(size_t(M * N));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double y = 0;
        for (int64_t k = 0; k < K; ++k) y += ad[size_t(m * K + k)] * wd[size_t(n * K + k)];
        if (epi.bias) y += bias[size_t(n)];
        if (epi.gelu) y = 0.5 * y * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (y + 0.044715 * y * y * y)));
        if (epi.residual) {
          const double gt = epi.gate ? gate[size_t((m / epi.rows_per_batch) * ld_gate + n)] : 1.0;
          y = double(bf16_to_f32(residual[size_t(m * ld_residual + n)])) + gt * y;
        }
        out[size_t(m * N + n)] = y;
      }
    return out;
  }

  Int8GemmOperands operands(void* out, ElemType out_type) const {
    Int8GemmOperands op;
    op.M = M, op.N = N, op.K = K;
    op.a = a.data(), op.lda = lda;
    op.w = w.data(), op.ldw = ldw;
    op.out = out, op.ldo = ldo, op.out_type = out_type;
    op.epilogue.bias = epi.bias ? bias.data() : nullptr;
    op.epilogue.activation = epi.gelu ? GemmActivation::GeluTanh : GemmActivation::None;
    if (epi.residual) {
      op.epilogue.residual = epi.in_place ? static_cast<const uint16_t*>(out) : residual.data();
      op.epilogue.ld_residual = epi.in_place ? ldo : ld_residual;
    }
    if (epi.gate) {
      op.epilogue.gate = gate.data();
      op.epilogue.ld_gate = ld_gate;
      op.epilogue.rows_per_batch = epi.rows_per_batch;
    }
    return op;
  }

  // Runs the reference for this problem's scheme on rows [m0, m1).
  Status run_ref(void* out, ElemType out_type, RefPrecision prec, int64_t m0 = 0, int64_t m1 = -1) const {
    if (scheme == Scheme::PostScale) {
      Int8GemmPostScaleArgs args;
      args.op = operands(out, out_type);
      args.a_scale = a_scale.data();
      args.w_scale = w_scale.data();
      return int8_gemm_post_scale_ref(args, prec, m0, m1);
    }
    Int8GemmBlockScaledArgs args;
    args.op = operands(out, out_type);
    args.a_scale = a_scale.data();
    args.a_scale_kind = scheme == Scheme::Token128 ? ActScale::Token128 : ActScale::Block128;
    args.ld_a_scale = ld_a_scale;
    args.w_scale = w_scale.data();
    args.ld_w_scale = ld_w_scale;
    return int8_gemm_block_scaled_ref(args, prec, m0, m1);
  }

  // Output buffer [M, ldo] of out_type, poisoned, or holding the residual for in-place runs.
  std::vector<uint8_t> make_out(ElemType out_type) const {
    const size_t esz = out_type == ElemType::F32 ? 4 : 2;
    std::vector<uint8_t> buf(size_t(M * ldo) * esz);
    test::poison(buf.data(), buf.size(), out_type == ElemType::F32 ? DType::F32 : DType::BF16);
    if (epi.in_place) {
      for (int64_t m = 0; m < M; ++m)
        std::memcpy(buf.data() + size_t(m * ldo) * 2, residual.data() + m * ld_residual, size_t(N) * 2);
    }
    return buf;
  }

  std::vector<double> read_out(const std::vector<uint8_t>& buf, ElemType out_type) const {
    std::vector<double> v(size_t(M * N));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = size_t(m * ldo + n);
        float f;
        if (out_type == ElemType::F32) {
          std::memcpy(&f, buf.data() + i * 4, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, buf.data() + i * 2, 2);
          f = bf16_to_f32(h);
        }
        v[size_t(m * N + n)] = f;
      }
    return v;
  }
};

const char* scheme_name(Scheme s) {
  return s == Scheme::PostScale ? "post-scale" : s == Scheme::Token128 ? "token128" : "block128";
}

// fp32 ref vs direct fp64: <= 1e-6 (float rounding of the scaled sums and the
// epilogue); fp64 ref: <= 1e-12; bf16 out = the fp32 result rounded once
// (bit-exact), within bf16's half-ulp (2^-9 relative per element) of fp64.
void check_problem(const Problem& p) {
  SCOPED_TRACE(testing::Message() << scheme_name(p.scheme) << " M=" << p.M << " N=" << p.N << " K=" << p.K
                                  << " bias=" << p.epi.bias << " gelu=" << p.epi.gelu << " residual=" << p.epi.residual
                                  << " gate=" << p.epi.gate << " in_place=" << p.epi.in_place);
  const std::vector<double> exact = p.direct();
  if (!p.epi.in_place) {
    auto out32 = p.make_out(ElemType::F32);
    ASSERT_EQ(p.run_ref(out32.data(), ElemType::F32, RefPrecision::F32), Status::Ok);
    TD_EXPECT_CLOSE(test::compare(p.read_out(out32, ElemType::F32), exact), 1e-6, 1 - 1e-12);

    auto out64 = p.make_out(ElemType::F32);
    ASSERT_EQ(p.run_ref(out64.data(), ElemType::F32, RefPrecision::F64), Status::Ok);
    // fp64 math rounded to an fp32 output: the output rounding (2^-24) dominates
    TD_EXPECT_CLOSE(test::compare(p.read_out(out64, ElemType::F32), exact), 1e-7, 1 - 1e-12);

    auto out16 = p.make_out(ElemType::BF16);
    ASSERT_EQ(p.run_ref(out16.data(), ElemType::BF16, RefPrecision::F32), Status::Ok);
    const auto got16 = p.read_out(out16, ElemType::BF16);
    const auto got32 = p.read_out(out32, ElemType::F32);
    size_t mismatches = 0;
    for (size_t i = 0; i < got16.size(); ++i)
      if (got16[i] != double(bf16_to_f32(f32_to_bf16(float(got32[i]))))) ++mismatches;
    EXPECT_EQ(mismatches, 0u) << "bf16 output is not the fp32 result rounded once";
    TD_EXPECT_CLOSE(test::compare(got16, exact), 4e-3, 0.9999);
  } else {
    auto out16 = p.make_out(ElemType::BF16);
    ASSERT_EQ(p.run_ref(out16.data(), ElemType::BF16, RefPrecision::F32), Status::Ok);
    TD_EXPECT_CLOSE(test::compare(p.read_out(out16, ElemType::BF16), exact), 4e-3, 0.9999);
  }
}

class GemmRefShapes : public testing::TestWithParam<Scheme> {};

TEST_P(GemmRefShapes, AwkwardMAndRaggedNK) {
  const Scheme s = GetParam();
  struct Shape {
    int64_t M, N, K;
  };
  // M 1/37/333 (not multiples of anything), N and K multiples of 128, a ragged
  // N (200: a partial 128-wide weight-scale block), and a ragged K (1000: the
  // last K block is 104 deep).
  const Shape shapes[] = {{1, 128, 128}, {37, 384, 512}, {333, 256, 384}, {37, 200, 256}, {64, 136, 1000}};
  for (const Shape& sh : shapes) check_problem(Problem(s, sh.M, sh.N, sh.K, {}));
}

TEST_P(GemmRefShapes, Epilogues) {
  const Scheme s = GetParam();
  EpilogueCase bias{.bias = true};
  EpilogueCase gelu{.bias = true, .gelu = true};
  EpilogueCase plain_residual{.residual = true};
  // 333 rows in batches of 100: 4 batches, the last one partial, and batch
  // edges that fall inside 128-row blocks
  EpilogueCase gated{.bias = true, .residual = true, .gate = true, .rows_per_batch = 100};
  EpilogueCase gelu_gated{.bias = true, .gelu = true, .residual = true, .gate = true, .rows_per_batch = 37};
  EpilogueCase in_place{.bias = true, .residual = true, .gate = true, .in_place = true, .rows_per_batch = 111};
  for (const EpilogueCase& e : {bias, gelu, plain_residual, gated, gelu_gated, in_place})
    check_problem(Problem(s, 333, 200, 384, e));
}

TEST_P(GemmRefShapes, RowSliceWritesOnlyItsRows) {
  const Scheme s = GetParam();
  Problem p(s, 300, 128, 256, EpilogueCase{.bias = true, .residual = true, .gate = true, .rows_per_batch = 70});
  const auto exact = p.direct();
  auto out = p.make_out(ElemType::F32);
  ASSERT_EQ(p.run_ref(out.data(), ElemType::F32, RefPrecision::F64, 130, 257), Status::Ok);
  const auto got = p.read_out(out, ElemType::F32);
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      const double v = got[size_t(m * p.N + n)];
      if (m >= 130 && m < 257)
        ASSERT_NEAR(v, exact[size_t(m * p.N + n)], 1e-5 * (1 + std::fabs(exact[size_t(m * p.N + n)])))
            << "m=" << m << " n=" << n;
      else
        ASSERT_TRUE(std::isnan(v)) << "row " << m << " outside the slice was written";
    }
  EXPECT_EQ(p.run_ref(out.data(), ElemType::F32, RefPrecision::F32, 200, 301), Status::InvalidArgument);
  EXPECT_EQ(p.run_ref(out.data(), ElemType::F32, RefPrecision::F32, 20, 10), Status::InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Schemes, GemmRefShapes,
                         testing::Values(Scheme::PostScale, Scheme::Token128, Scheme::Block128),
                         [](const testing::TestParamInfo<Scheme>& i) {
                           return std::string(i.param == Scheme::PostScale ? "PostScale"
                                              : i.param == Scheme::Token128 ? "Token128"
                                                                            : "Block128");
                         });

// The post-scale accumulation is continuous over K, exact in integers: with
// K = 13824 (the largest Wan K) and same-sign extreme codes the sum reaches
// 13824 * 128 * 128 = 2^27.75, beyond fp32's exact integers and 1/9 of int32.
TEST(GemmRef, PostScaleLongKExtremeCodes) {
  Problem p(Scheme::PostScale, 3, 16, 13824, {});
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t k = 0; k < p.K; ++k) p.a[size_t(m * p.lda + k)] = int8_t(m == 1 ? 127 : -128);
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t k = 0; k < p.K; ++k) p.w[size_t(n * p.ldw + k)] = int8_t(n % 2 == 0 ? -128 : ((k + n) % 3 ? 127 : -128));
  check_problem(p);
}

TEST(GemmRef, ArgumentChecks) {
  Problem p(Scheme::PostScale, 4, 16, 32, {});
  std::vector<float> out(size_t(p.M * p.ldo));
  Int8GemmPostScaleArgs args;
  args.op = p.operands(out.data(), ElemType::F32);
  args.a_scale = p.a_scale.data();
  args.w_scale = p.w_scale.data();
  EXPECT_EQ(int8_gemm_post_scale_check(args), Status::Ok);
  auto bad = args;
  bad.op.lda = p.K - 1;
  EXPECT_EQ(int8_gemm_post_scale_ref(bad), Status::InvalidArgument);
  bad = args;
  bad.w_scale = nullptr;
  EXPECT_EQ(int8_gemm_post_scale_ref(bad), Status::InvalidArgument);
  bad = args;
  bad.op.out_type = ElemType::F16;
  EXPECT_EQ(int8_gemm_post_scale_ref(bad), Status::InvalidArgument);
  bad = args;
  bad.op.epilogue.gate = p.a_scale.data();  // a gate without a residual
  bad.op.epilogue.ld_gate = p.N;
  bad.op.epilogue.rows_per_batch = 1;
  EXPECT_EQ(int8_gemm_post_scale_ref(bad), Status::InvalidArgument);
  bad = args;
  bad.op.epilogue.residual = static_cast<const uint16_t*>(bad.op.out);  // in place needs a bf16 out
  bad.op.epilogue.ld_residual = p.ldo;
  EXPECT_EQ(int8_gemm_post_scale_ref(bad), Status::InvalidArgument);

  Int8GemmBlockScaledArgs bargs;
  bargs.op = args.op;
  bargs.a_scale = p.a_scale.data();
  bargs.a_scale_kind = ActScale::Token128;
  bargs.ld_a_scale = p.M - 1;  // < M
  bargs.w_scale = p.w_scale.data();
  bargs.ld_w_scale = 1;
  EXPECT_EQ(int8_gemm_block_scaled_check(bargs), Status::InvalidArgument);
  bargs.ld_a_scale = p.M;
  EXPECT_EQ(int8_gemm_block_scaled_check(bargs), Status::Ok);
  bargs.ld_w_scale = 0;
  EXPECT_EQ(int8_gemm_block_scaled_check(bargs), Status::InvalidArgument);

  // What the CUDA kernels take (checked on the host, no GPU needed).
  Int8GemmOperands op = args.op;
  op.out_type = ElemType::BF16;
  alignas(16) static int8_t buf[64];
  alignas(16) static float sc[16];
  op.a = buf, op.w = buf, op.out = buf, op.lda = 32, op.ldw = 32, op.ldo = 16, op.K = 32, op.N = 16;
  EXPECT_EQ(int8_gemm_cuda_supported(op, sc, sc), Status::Ok) << int8_gemm_cuda_unsupported_reason(op, sc, sc);
  auto op2 = op;
  op2.K = 40;
  EXPECT_EQ(int8_gemm_cuda_supported(op2, sc, sc), Status::Unsupported);
  EXPECT_NE(std::string(int8_gemm_cuda_unsupported_reason(op2, sc, sc)).find("K"), std::string::npos);
  op2 = op;
  op2.N = 12;
  EXPECT_EQ(int8_gemm_cuda_supported(op2, sc, sc), Status::Unsupported);
  op2 = op;
  op2.a = buf + 1;
  EXPECT_EQ(int8_gemm_cuda_supported(op2, sc, sc), Status::Unsupported);
  op2 = op;
  op2.out_type = ElemType::F32;
  EXPECT_EQ(int8_gemm_cuda_supported(op2, sc, sc), Status::Unsupported);
}

}  // namespace
}  // namespace td::kernels
