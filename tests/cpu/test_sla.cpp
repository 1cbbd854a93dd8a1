// SLA (sparse-linear attention) fp32 CPU reference: each piece against a direct
// fp64 implementation, the dense limit against exact attention, tiny sequences,
// both layouts, and `turbodiff dit --attention sla|sagesla` on the DiT fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "core/error.h"
#include "harness/harness.h"
#include "io/safetensors.h"
#include "kernels/sla/sla.h"
#include "models/wan/wan_dit.h"
#include "models/wan/wan_loader.h"
#include "ops/attention.h"
#include "ops/sla.h"

namespace td {
namespace {

using kernels::SlaFeatureMap;
using kernels::SlaProblem;
using kernels::Status;

// A contiguous BLHD problem of random fp32 Q/K/V.
struct Case {
  SlaProblem p;
  std::vector<float> q, k, v;
  int64_t elems() const { return p.batch * p.len * p.heads * p.head_dim; }
};

Case make_case(int64_t B, int64_t H, int64_t L, int64_t D, int64_t bq, int64_t bk, double topk,
               SlaFeatureMap fm = SlaFeatureMap::Softmax) {
  Case c;
  c.p.batch = B;
  c.p.heads = H;
  c.p.len = L;
  c.p.head_dim = D;
  c.p.q = c.p.k = c.p.v = c.p.o = kernels::attn_contiguous_strides(kernels::AttnLayout::BLHD, H, L, D);
  c.p.scale = float(1.0 / std::sqrt(double(D)));
  c.p.block_q = bq;
  c.p.block_k = bk;
  c.p.topk = topk;
  c.p.feature_map = fm;
  const size_t n = size_t(c.elems());
  c.q = test::randn(n);
  c.k = test::randn(n, 0.3f);  // a K mean that smoothing must remove
  c.v = test::randn(n);
  return c;
}

inline size_t idx(const SlaProblem& p, int64_t b, int64_t h, int64_t t, int64_t c) {
  return size_t(((b * p.len + t) * p.heads + h) * p.head_dim + c);
}

// fp64 pooled scores [B, H, QB, KB] of mean-pooled Q and mean-pooled smoothed K.
std::vector<double> ref_scores(const Case& c) {
  const SlaProblem& p = c.p;
  const int64_t QB = p.query_blocks(), KB = p.key_blocks(), D = p.head_dim, L = p.len;
  std::vector<double> out;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      std::vector<double> mean(size_t(D), 0.0);
      for (int64_t t = 0; t < L; ++t)
        for (int64_t d = 0; d < D; ++d) mean[size_t(d)] += c.k[idx(p, b, h, t, d)] / double(L);
      auto pool = [&](const std::vector<float>& x, int64_t blk, int64_t i, bool smooth) {
        std::vector<double> r(size_t(D), 0.0);
        const int64_t t0 = i * blk, t1 = std::min(L, t0 + blk);
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t d = 0; d < D; ++d) r[size_t(d)] += x[idx(p, b, h, t, d)] - (smooth ? mean[size_t(d)] : 0.0);
        for (auto& e : r) e /= double(t1 - t0);
        return r;
      };
      for (int64_t i = 0; i < QB; ++i) {
        const auto pq = pool(c.q, p.block_q, i, false);
        for (int64_t j = 0; j < KB; ++j) {
          const auto pk = pool(c.k, p.block_k, j, true);
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += pq[size_t(d)] * pk[size_t(d)];
          out.push_back(s);
        }
      }
    }
  return out;
}

// fp64 attention of each query over the tokens of its block's LUT entries.
std::vector<double> ref_sparse(const Case& c, const std::vector<int32_t>& lut, int64_t n_sel, std::vector<double>* lse) {
  const SlaProblem& p = c.p;
  const int64_t QB = p.query_blocks(), D = p.head_dim, L = p.len;
  std::vector<double> o(size_t(c.elems()));
  if (lse) lse->assign(size_t(p.batch * p.heads * L), 0.0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t t = 0; t < L; ++t) {
        const int64_t i = t / p.block_q;
        std::vector<int64_t> keys;
        for (int64_t e = 0; e < n_sel; ++e) {
          const int64_t j = lut[size_t(((b * p.heads + h) * QB + i) * n_sel + e)];
          for (int64_t u = j * p.block_k; u < std::min(L, (j + 1) * p.block_k); ++u) keys.push_back(u);
        }
        std::vector<double> s;
        double mx = -INFINITY;
        for (int64_t u : keys) {
          double d = 0;
          for (int64_t x = 0; x < D; ++x) d += double(c.q[idx(p, b, h, t, x)]) * c.k[idx(p, b, h, u, x)];
          s.push_back(d * p.scale);
          mx = std::max(mx, s.back());
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (int64_t x = 0; x < D; ++x) {
          double acc = 0;
          for (size_t n = 0; n < keys.size(); ++n) acc += s[n] * c.v[idx(p, b, h, keys[n], x)];
          o[idx(p, b, h, t, x)] = acc / sum;
        }
        if (lse) (*lse)[size_t((b * p.heads + h) * L + t)] = mx + std::log(sum);
      }
  return o;
}

std::vector<double> phi64(SlaFeatureMap fm, const float* x, int64_t D) {
  std::vector<double> r(static_cast<size_t>(D));
  if (fm == SlaFeatureMap::Softmax) {
    double mx = x[0], sum = 0;
    for (int64_t d = 0; d < D; ++d) mx = std::max(mx, double(x[d]));
    for (int64_t d = 0; d < D; ++d) sum += (r[size_t(d)] = std::exp(x[d] - mx));
    for (auto& e : r) e /= sum;
  } else if (fm == SlaFeatureMap::Elu) {
    for (int64_t d = 0; d < D; ++d) r[size_t(d)] = x[d] > 0 ? x[d] + 1.0 : std::exp(double(x[d]));
  } else {
    for (int64_t d = 0; d < D; ++d) r[size_t(d)] = std::max(0.0, double(x[d]));
  }
  return r;
}

// fp64 global linear attention, written the direct (quadratic) way:
// o_i = Σ_j (φq_i·φk_j) v_j / (Σ_j φq_i·φk_j + 1e-5).
std::vector<double> ref_linear(const Case& c) {
  const SlaProblem& p = c.p;
  const int64_t D = p.head_dim, L = p.len;
  std::vector<double> o(size_t(c.elems()));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      std::vector<std::vector<double>> pk;
      for (int64_t u = 0; u < L; ++u) pk.push_back(phi64(p.feature_map, &c.k[idx(p, b, h, u, 0)], D));
      for (int64_t t = 0; t < L; ++t) {
        const auto pq = phi64(p.feature_map, &c.q[idx(p, b, h, t, 0)], D);
        std::vector<double> num(size_t(D), 0.0);
        double den = 1e-5;
        for (int64_t u = 0; u < L; ++u) {
          double w = 0;
          for (int64_t d = 0; d < D; ++d) w += pq[size_t(d)] * pk[size_t(u)][size_t(d)];
          den += w;
          for (int64_t d = 0; d < D; ++d) num[size_t(d)] += w * c.v[idx(p, b, h, u, d)];
        }
        for (int64_t d = 0; d < D; ++d) o[idx(p, b, h, t, d)] = num[size_t(d)] / den;
      }
    }
  return o;
}

std::vector<double> to64(const std::vector<float>& x) { return {x.begin(), x.end()}; }

std::vector<float> poisoned(size_t n) {
  std::vector<float> x(n);
  test::poison(x.data(), n * sizeof(float), DType::F32);
  return x;
}

TEST(Sla, SelectedBlockCountFollowsTurboDiffusionWithAtLeastOne) {
  EXPECT_EQ(kernels::sla_selected_blocks(0.1, 512), 51);  // Wan 480p, 64-token key blocks
  EXPECT_EQ(kernels::sla_selected_blocks(0.1, 256), 25);  // 128-token key blocks (sm90 SageSLA)
  EXPECT_EQ(kernels::sla_selected_blocks(0.29, 100), 28);  // Python int(0.29 * 100) == 28
  EXPECT_EQ(kernels::sla_selected_blocks(1.0, 7), 7);
  EXPECT_EQ(kernels::sla_selected_blocks(0.1, 5), 1);  // floor gives 0: one block kept
  EXPECT_EQ(kernels::sla_selected_blocks(0.05, 1), 1);
}

// Each row of the map holds n_sel ones, the LUT lists exactly those blocks by
// descending fp64 score, and any block where the selection differs from the
// fp64 top-n_sel ties the n_sel-th score to rounding.
void check_block_map(const Case& c) {
  const SlaProblem& p = c.p;
  const int64_t QB = p.query_blocks(), KB = p.key_blocks(), n_sel = kernels::sla_selected_blocks(p.topk, KB);
  std::vector<uint8_t> map(size_t(p.batch * p.heads * QB * KB), 0xAB);
  std::vector<int32_t> lut(size_t(p.batch * p.heads * QB * n_sel), -7);
  ASSERT_EQ(kernels::sla_block_map_cpu(p, c.q.data(), c.k.data(), map.data(), lut.data()), Status::Ok)
      << kernels::sla_last_error();
  const auto scores = ref_scores(c);
  int64_t near_ties = 0;
  for (int64_t r = 0; r < p.batch * p.heads * QB; ++r) {
    std::vector<double> s(scores.begin() + r * KB, scores.begin() + (r + 1) * KB), sorted = s;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const double kth = sorted[size_t(n_sel - 1)], span = std::max(1e-30, sorted.front() - sorted.back());
    int64_t ones = 0;
    for (int64_t j = 0; j < KB; ++j) {
      const uint8_t m = map[size_t(r * KB + j)];
      ASSERT_TRUE(m == 0 || m == 1) << "row " << r << " block " << j << " = " << int(m);
      ones += m;
      const bool ref_sel = s[size_t(j)] >= kth;
      if (bool(m) != ref_sel) {
        EXPECT_LE(std::abs(s[size_t(j)] - kth), 1e-5 * span) << "row " << r << " block " << j << " not a tie";
        ++near_ties;
      }
    }
    EXPECT_EQ(ones, n_sel) << "row " << r;
    for (int64_t e = 0; e < n_sel; ++e) {
      const int32_t j = lut[size_t(r * n_sel + e)];
      ASSERT_TRUE(j >= 0 && j < KB) << "row " << r << " LUT entry " << e << " = " << j;
      EXPECT_EQ(map[size_t(r * KB + j)], 1) << "row " << r << " LUT block " << j << " not in the map";
      if (e > 0) EXPECT_LE(s[size_t(j)], s[size_t(lut[size_t(r * n_sel + e - 1)])] + 1e-5 * span) << "row " << r;
    }
  }
  EXPECT_LE(near_ties, 2) << "more near-ties than random data should give";
}

TEST(Sla, BlockMapMatchesFp64TopK) {
  check_block_map(make_case(2, 3, 203, 24, 32, 16, 0.3));   // partial last blocks, 7 x 13 blocks
  check_block_map(make_case(1, 2, 333, 16, 128, 64, 0.5));  // SLA's 128 x 64
  check_block_map(make_case(1, 2, 333, 16, 64, 128, 0.34)); // SageSLA's sm90 64 x 128
}

TEST(Sla, TiedScoresPickTheLowestKeyBlocksInOrder) {
  // A K constant over tokens is all zero after smoothing: every pooled score ties.
  Case c = make_case(1, 2, 100, 8, 16, 16, 0.5);
  for (int64_t t = 0; t < c.p.len; ++t)
    for (int64_t h = 0; h < c.p.heads; ++h)
      for (int64_t d = 0; d < c.p.head_dim; ++d) c.k[idx(c.p, 0, h, t, d)] = float(d) * 0.25f - 1.0f;
  const int64_t QB = c.p.query_blocks(), KB = c.p.key_blocks(), n_sel = kernels::sla_selected_blocks(0.5, KB);
  ASSERT_EQ(n_sel, 3);
  std::vector<int32_t> lut(size_t(c.p.heads * QB * n_sel), -1);
  ASSERT_EQ(kernels::sla_block_map_cpu(c.p, c.q.data(), c.k.data(), nullptr, lut.data()), Status::Ok);
  for (size_t e = 0; e < lut.size(); ++e) EXPECT_EQ(lut[e], int32_t(e % size_t(n_sel))) << "entry " << e;
}

TEST(Sla, SparseBranchMatchesFp64BlockSparseAttention) {
  for (auto [L, bq, bk, topk] : {std::tuple{203, 32, 16, 0.3}, std::tuple{333, 128, 64, 0.4}}) {
    Case c = make_case(2, 3, L, 24, bq, bk, topk);
    const int64_t n_sel = kernels::sla_selected_blocks(topk, c.p.key_blocks());
    std::vector<int32_t> lut(size_t(c.p.batch * c.p.heads * c.p.query_blocks() * n_sel));
    ASSERT_EQ(kernels::sla_block_map_cpu(c.p, c.q.data(), c.k.data(), nullptr, lut.data()), Status::Ok);
    auto o = poisoned(size_t(c.elems()));
    auto lse = poisoned(size_t(c.p.batch * c.p.heads * c.p.len));
    ASSERT_EQ(kernels::sla_sparse_cpu(c.p, c.q.data(), c.k.data(), c.v.data(), lut.data(), n_sel, o.data(), lse.data()),
              Status::Ok)
        << kernels::sla_last_error();
    std::vector<double> ref_lse;
    const auto ref = ref_sparse(c, lut, n_sel, &ref_lse);
    TD_EXPECT_CLOSE(test::compare(to64(o), ref), 1e-5, 0.99999);
    TD_EXPECT_CLOSE(test::compare(to64(lse), ref_lse), 1e-6, 0.99999);
  }
}

TEST(Sla, SparseBranchRejectsABadLut) {
  Case c = make_case(1, 1, 40, 8, 16, 16, 0.5);
  std::vector<int32_t> lut(size_t(c.p.query_blocks()), 3);  // only blocks 0..2 exist
  std::vector<float> o(size_t(c.elems()));
  EXPECT_EQ(kernels::sla_sparse_cpu(c.p, c.q.data(), c.k.data(), c.v.data(), lut.data(), 1, o.data(), nullptr),
            Status::InvalidArgument);
  EXPECT_NE(std::string(kernels::sla_last_error()).find("outside [0, 3)"), std::string::npos) << kernels::sla_last_error();
}

TEST(Sla, LinearBranchMatchesFp64ForEveryFeatureMap) {
  for (SlaFeatureMap fm : {SlaFeatureMap::Softmax, SlaFeatureMap::Elu, SlaFeatureMap::Relu}) {
    Case c = make_case(2, 2, 157, 20, 128, 64, 0.1, fm);
    auto o = poisoned(size_t(c.elems()));
    ASSERT_EQ(kernels::sla_linear_cpu(c.p, c.q.data(), c.k.data(), c.v.data(), o.data()), Status::Ok);
    TD_EXPECT_CLOSE(test::compare(to64(o), ref_linear(c)), 1e-5, 0.99999);
  }
}

TEST(Sla, WholeLayerIsSparsePlusProjectedLinear) {
  Case c = make_case(2, 3, 251, 16, 32, 64, 0.25);
  const int64_t D = c.p.head_dim, n_sel = kernels::sla_selected_blocks(0.25, c.p.key_blocks());
  const auto w = test::randn(size_t(D * D), 0.f, 0.2f), bias = test::randn(size_t(D));
  auto o = poisoned(size_t(c.elems()));
  std::vector<int32_t> lut(size_t(c.p.batch * c.p.heads * c.p.query_blocks() * n_sel));
  std::vector<uint8_t> map(size_t(c.p.batch * c.p.heads * c.p.query_blocks() * c.p.key_blocks()));
  ASSERT_EQ(kernels::sla_cpu(c.p, c.q.data(), c.k.data(), c.v.data(), w.data(), bias.data(), o.data(), map.data(),
                             lut.data()),
            Status::Ok)
      << kernels::sla_last_error();
  // The LUT the layer used is the block-selection's own.
  std::vector<int32_t> lut2(lut.size());
  ASSERT_EQ(kernels::sla_block_map_cpu(c.p, c.q.data(), c.k.data(), nullptr, lut2.data()), Status::Ok);
  EXPECT_EQ(lut, lut2);
  auto ref = ref_sparse(c, lut, n_sel, nullptr);
  const auto ol = ref_linear(c);
  for (size_t r = 0; r < ref.size() / size_t(D); ++r)
    for (int64_t i = 0; i < D; ++i) {
      double acc = bias[size_t(i)];
      for (int64_t j = 0; j < D; ++j) acc += double(w[size_t(i * D + j)]) * ol[r * size_t(D) + size_t(j)];
      ref[r * size_t(D) + size_t(i)] += acc;
    }
  TD_EXPECT_CLOSE(test::compare(to64(o), ref), 1e-5, 0.99999);
}

Tensor tensor_of(const std::vector<float>& x, const Shape& s) { return Tensor::from_f32(s, x); }

TEST(Sla, DenseLimitEqualsExactAttention) {
  // topk = 1 keeps every key block; proj_l = 0 removes the linear branch.
  for (auto [L, bq, bk] : {std::tuple{300, 128, 64}, std::tuple{77, 64, 128}, std::tuple{129, 16, 32}}) {
    Case c = make_case(2, 3, L, 32, bq, bk, 1.0);
    const Shape s{2, L, 3, 32};
    const Tensor q = tensor_of(c.q, s), k = tensor_of(c.k, s), v = tensor_of(c.v, s);
    ops::SlaOptions so;
    so.topk = 1.0;
    so.block_q = bq;
    so.block_k = bk;
    const Tensor got = ops::sla(q, k, v, Tensor(), Tensor(), so);
    TD_EXPECT_CLOSE(test::compare(got, ops::attention(q, k, v)), 1e-5, 0.99999);
    // A zero proj_l given explicitly is the same.
    const Tensor zw = Tensor::zeros({32, 32}, DType::F32), zb = Tensor::zeros({32}, DType::F32);
    TD_EXPECT_CLOSE(test::compare(ops::sla(q, k, v, zw, zb, so), ops::attention(q, k, v)), 1e-5, 0.99999);
  }
}

TEST(Sla, TinySequencesKeepOneBlock) {
  // topk · key blocks < 1: one key block per query block, never zero (TurboDiffusion's int() would give 0).
  for (auto [L, topk] : {std::tuple{5, 0.1}, std::tuple{64, 0.5}, std::tuple{190, 0.2}}) {
    Case c = make_case(1, 2, L, 16, 128, 64, topk);
    const int64_t n_sel = kernels::sla_selected_blocks(topk, c.p.key_blocks());
    EXPECT_EQ(n_sel, 1) << "L " << L;
    std::vector<int32_t> lut(size_t(c.p.heads * c.p.query_blocks()));
    auto o = poisoned(size_t(c.elems()));
    ASSERT_EQ(kernels::sla_cpu(c.p, c.q.data(), c.k.data(), c.v.data(), nullptr, nullptr, o.data(), nullptr, lut.data()),
              Status::Ok);
    TD_EXPECT_CLOSE(test::compare(to64(o), ref_sparse(c, lut, 1, nullptr)), 1e-5, 0.99999);
    if (L <= 64) {  // one key block in all: the layer is exact attention
      const Shape s{1, L, 2, 16};
      TD_EXPECT_CLOSE(test::compare(tensor_of(o, s), ops::attention(tensor_of(c.q, s), tensor_of(c.k, s),
                                                                    tensor_of(c.v, s))),
                      1e-5, 0.99999);
    }
  }
}

TEST(Sla, BothLayoutsAndDtypesGiveTheSameLayer) {
  const int64_t B = 2, H = 3, L = 150, D = 16;
  const Tensor q = test::randn_tensor({B, L, H, D}, DType::F32), k = test::randn_tensor({B, L, H, D}, DType::F32),
               v = test::randn_tensor({B, L, H, D}, DType::F32);
  const Tensor w = test::randn_tensor({D, D}, DType::F32, 0.3f), bias = test::randn_tensor({D}, DType::F32);
  ops::SlaOptions so;
  so.topk = 0.3;
  so.block_q = 32;
  so.block_k = 16;
  const Tensor blhd = ops::sla(q, k, v, w, bias, so);
  EXPECT_EQ(blhd.shape(), (Shape{B, L, H, D}));
  // BHLD storage viewed as [B, L, H, D].
  auto bhld = [](const Tensor& t) { return t.permute({0, 2, 1, 3}).contiguous().permute({0, 2, 1, 3}); };
  TD_EXPECT_CLOSE(test::compare(ops::sla(bhld(q), bhld(k), bhld(v), w, bias, so), blhd), 1e-6, 0.999999);
  // bf16 inputs: converted to fp32, output in bf16.
  const Tensor out16 = ops::sla(q.to(DType::BF16), k.to(DType::BF16), v.to(DType::BF16), w, bias, so);
  EXPECT_EQ(out16.dtype(), DType::BF16);
}

TEST(Sla, OpsRejectBadArguments) {
  const Tensor q = test::randn_tensor({1, 20, 2, 8}, DType::F32);
  ops::SlaOptions so;
  so.topk = 0;
  try {
    ops::sla(q, q, q, Tensor(), Tensor(), so);
    ADD_FAILURE() << "topk 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk"), std::string::npos) << e.what();
  }
  so.topk = 0.5;
  try {
    ops::sla(q, q, q, Tensor::zeros({8, 4}, DType::F32), Tensor::zeros({8}, DType::F32), so);
    ADD_FAILURE() << "proj_l [8, 4] accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("proj_l"), std::string::npos) << e.what();
  }
  try {
    ops::sla(q, q.slice(1, 0, 10).contiguous(), q, Tensor(), Tensor(), so);
    ADD_FAILURE() << "k of another length accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Shape) << e.what();
  }
  if (test::gpu_available()) {
    const Tensor g = q.to(DType::BF16).to(Device::cuda(0));
    try {
      ops::sla(g, g, g, Tensor(), Tensor(), so);
      ADD_FAILURE() << "head_dim 8 was accepted on CUDA";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
      EXPECT_NE(std::string(e.what()).find("head_dim 64 or 128"), std::string::npos) << e.what();
    }
  }
}

// ---- `turbodiff dit --attention sla|sagesla` ------------------------------------------

std::string dit_fixture(const std::string& rel) { return test::source_dir() + "/fixtures/dit/" + rel; }

Tensor velocity_of(const std::string& path) {
  const io::TensorFile f = io::read_safetensors(path);
  for (const auto& [n, t] : f.tensors)
    if (n == "velocity") return t.contiguous();
  ADD_FAILURE() << path << " has no velocity";
  return {};
}

TEST(SlaDitCli, TopkOneWithZeroProjLEqualsOriginal) {
  // fixtures/dit/t2v/turbo.pth carries all-zero SLA proj_l tensors.
  const std::string dir = test::temp_dir();
  const std::string base = "dit --weights " + dit_fixture("t2v/turbo.pth") + " --inputs " +
                           dit_fixture("t2v/inputs.safetensors") + " --device cpu --out ";
  auto r = test::run_cli(base + dir + "/original.safetensors --attention original");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Tensor original = velocity_of(dir + "/original.safetensors");
  for (const char* sw : {"--attention sla --sla-topk 1.0", "--attention sagesla --sla-topk 1.0",
                                              "--attention sla --sla-topk 0.1"}) {  // 45 tokens: one key block, so 0.1 keeps all too
    const std::string out = dir + "/sla.safetensors";
    r = test::run_cli(base + out + " " + sw);
    ASSERT_EQ(r.exit_code, 0) << sw << ": " << r.err;
    EXPECT_NE(r.out.find("attention s"), std::string::npos) << r.out;
    TD_EXPECT_CLOSE(test::compare(velocity_of(out), original), 1e-5, 0.99999);
  }
}

TEST(SlaWanDiT, UsesTheCheckpointsProjL) {
  // A non-zero proj_l in one block moves the output off exact attention, and by
  // the same amount for sla as for sagesla (45 tokens: one key block either way,
  // so the sparse branch is exact and only proj_l(o_l) differs).
  using namespace models::wan;
  auto in = io::read_safetensors(dit_fixture("t2v/inputs.safetensors"));
  std::map<std::string, Tensor> x;
  for (const auto& [n, t] : in.tensors) x[n] = t;
  Tensor new_bias;  // one random proj_l bias for every perturbed load
  auto load = [&](bool perturb) {
    WanCheckpoint ck = load_wan_checkpoint({dit_fixture("t2v/turbo.pth")}, WanLoadOptions{});
    EXPECT_TRUE(ck.has_proj_l);
    if (perturb) {
      Tensor& bias = ck.tensors.at("blocks.0.self_attn.attn_op.local_attn.proj_l.bias");
      if (!new_bias.defined()) new_bias = test::randn_tensor(bias.shape(), DType::F32, 0.5f);
      bias = new_bias;
    }
    return ck;
  };
  const Tensor original = WanDiT(load(false)).forward(x["latent"], x["timestep"], x["context"]);
  const Tensor zero_proj = WanDiT(load(false), nn::AttentionKind::SLA, 0.1).forward(x["latent"], x["timestep"], x["context"]);
  TD_EXPECT_CLOSE(test::compare(zero_proj, original), 1e-5, 0.99999);
  const Tensor sla = WanDiT(load(true), nn::AttentionKind::SLA, 0.1).forward(x["latent"], x["timestep"], x["context"]);
  EXPECT_GT(test::compare(sla, original).rel_l2, 1e-3) << "proj_l had no effect";
  const Tensor sage = WanDiT(load(true), nn::AttentionKind::SageSLA, 0.1).forward(x["latent"], x["timestep"], x["context"]);
  EXPECT_LT(test::compare(sage, sla).rel_l2, 1e-3) << "sagesla and sla differ with one key block";
}

}  // namespace
}  // namespace td
