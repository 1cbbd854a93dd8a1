// The Tensor-level ops: validation (clear errors naming the op and tensor),
// row views of strided tensors, and agreement with a direct formula on the CPU.
#include <cmath>

#include "harness/harness.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/norm.h"

namespace td::ops {
namespace {

TEST(Ops, AsRowsCollapsesLeadingDimsAndRejectsBadStrides) {
  Tensor t = Tensor::empty({2, 3, 5, 8}, DType::F32);
  Rows r = as_rows(t, "op", "x");
  EXPECT_EQ(r.rows, 30);
  EXPECT_EQ(r.dim, 8);
  EXPECT_EQ(r.stride, 8);
  Tensor s = Tensor::empty({7, 16}, DType::BF16).slice(1, 0, 10);  // row stride 16, dim 10
  r = as_rows(s, "op", "x");
  EXPECT_EQ(r.stride, 16);
  EXPECT_EQ(r.dim, 10);
  EXPECT_THROW(as_rows(Tensor::empty({4, 6}, DType::F32).permute({1, 0}), "op", "x"), Error);
  EXPECT_THROW(as_rows(Tensor::empty({4, 6, 8}, DType::F32).slice(1, 0, 3), "op", "x"), Error);
}

TEST(Ops, RmsNormOnStridedRowsMatchesFormula) {
  Tensor base = test::randn_tensor({33, 100}, DType::F32);
  Tensor x = base.slice(1, 0, 96);  // strided rows
  Tensor w = test::randn_tensor({96}, DType::F32, 0.2f, 1.0f);
  Tensor y = rms_norm(x, w, 1e-6f);
  ASSERT_EQ(y.shape(), (Shape{33, 96}));
  std::vector<double> ref, got;
  for (int64_t r = 0; r < 33; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < 96; ++i) ss += base.item_f64(r * 100 + i) * base.item_f64(r * 100 + i);
    const double inv = 1.0 / std::sqrt(ss / 96 + 1e-6);
    for (int64_t i = 0; i < 96; ++i) {
      ref.push_back(base.item_f64(r * 100 + i) * inv * w.item_f64(i));
      got.push_back(y.item_f64(r * 96 + i));
    }
  }
  TD_EXPECT_CLOSE(test::compare(got, ref), 1e-6, 0.999999);
}

TEST(Ops, AdalnModulatePerSampleRowsFromWanModulation) {
  // scale/shift as rows of a [B, 6, D] modulation tensor (row stride 6*D), as Wan keeps them
  const int64_t B = 2, L = 21, D = 64;
  Tensor x = test::randn_tensor({B, L, D}, DType::BF16);
  Tensor mod = test::randn_tensor({B, 6, D}, DType::F32, 0.3f);
  Tensor shift = mod.select(1, 0), scale = mod.select(1, 1);
  Tensor y = adaln_modulate(x, scale, shift, 1e-6f, DType::F32);
  std::vector<double> ref, got;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < D; ++i) mean += x.item_f64((b * L + l) * D + i);
      mean /= D;
      for (int64_t i = 0; i < D; ++i) var += std::pow(x.item_f64((b * L + l) * D + i) - mean, 2);
      var /= D;
      for (int64_t i = 0; i < D; ++i) {
        const double n = (x.item_f64((b * L + l) * D + i) - mean) / std::sqrt(var + 1e-6);
        ref.push_back(n * (1 + mod.item_f64((b * 6 + 1) * D + i)) + mod.item_f64((b * 6 + 0) * D + i));
        got.push_back(y.item_f64((b * L + l) * D + i));
      }
    }
  TD_EXPECT_CLOSE(test::compare(got, ref), 1e-5, 0.99999);
}

TEST(Ops, ResidualGateNormUpdatesResidualInPlace) {
  const int64_t B = 1, L = 19, D = 96;
  Tensor x = test::randn_tensor({B, L, D}, DType::F32);
  Tensor x0 = x.clone();
  Tensor y = test::randn_tensor({B, L, D}, DType::BF16);
  Tensor gate = test::randn_tensor({B, D}, DType::F32);
  Tensor w = test::randn_tensor({D}, DType::F32), b = test::randn_tensor({D}, DType::F32);
  ResidualNormArgs a;
  a.gate = gate;
  a.weight = w;
  a.bias = b;
  Tensor out = residual_gate_norm(x, y, a);
  std::vector<double> got, ref;
  for (int64_t i = 0; i < L * D; ++i) {
    got.push_back(x.item_f64(i));
    ref.push_back(x0.item_f64(i) + gate.item_f64(i % D) * y.item_f64(i));
  }
  TD_EXPECT_CLOSE(test::compare(got, ref), 1e-6, 0.999999);
  // the normalized output equals layer_norm of the updated residual
  TD_EXPECT_CLOSE(test::compare(out, layer_norm(x, w, b, 1e-6f, out.dtype())), 1e-6, 0.999999);
}

TEST(Ops, ClearErrorsForBadArguments) {
  Tensor x = test::randn_tensor({4, 32}, DType::BF16);
  try {
    rms_norm(x, Tensor::empty({31}, DType::F32), 1e-6f);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rms_norm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(rms_norm(Tensor::empty({4, 32}, DType::I32), Tensor(), 1e-6f), Error);
  EXPECT_THROW(adaln_modulate(x, Tensor::empty({3, 32}, DType::F32), Tensor::empty({3, 32}, DType::F32), 1e-6f), Error);
  EXPECT_THROW(add(x, Tensor::empty({5}, DType::F32)), Error);
  Tensor y = test::randn_tensor({4, 32}, DType::BF16);
  Tensor z = add(x, y);
  EXPECT_NEAR(z.item_f64(5), x.item_f64(5) + y.item_f64(5), 1e-2);
}

TEST(Ops, ActivationsMatchFormulas) {
  Tensor x = test::randn_tensor({13, 77}, DType::F32, 3.0f);
  Tensor g = gelu_tanh(x), s = silu(x);
  std::vector<double> gr, sr, gg, sg;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.item_f64(i);
    gr.push_back(0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
    sr.push_back(v / (1 + std::exp(-v)));
    gg.push_back(g.item_f64(i));
    sg.push_back(s.item_f64(i));
  }
  TD_EXPECT_CLOSE(test::compare(gg, gr), 1e-6, 0.999999);
  TD_EXPECT_CLOSE(test::compare(sg, sr), 1e-6, 0.999999);
}

}  // namespace
}  // namespace td::ops
