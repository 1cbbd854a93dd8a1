// SLA on the GPU (issue 6) against the fp32 CPU reference (kernels/sla) and
// fp64 formulas, on fresh random BF16 inputs (K with a non-zero mean, so the
// smoothing matters) of awkward lengths, both layouts, head_dim 64 and 128,
// NaN-poisoned outputs:
//   - block selection: the LUT / map equal sla_block_map_cpu's up to ties
//     (a GPU-selected block whose fp64 score is below the n_sel-th must tie it
//     to 1e-4 of the row's score range; at most 1% of rows may differ at all),
//     for both top-k variants (bitonic sort, radix select), and the radix
//     select's LUT / map equal the bitonic sort's bit for bit (ties included);
//   - sparse branch (BF16 flash, 128 x 64): rel L2 <= 1e-2 against fp64
//     block-sparse attention with the same LUT, LSE within 2e-3;
//   - linear branch (proj_l = identity onto a zero o): rel L2 <= 1e-2 against
//     sla_linear_cpu for softmax / elu+1 / relu, the same bits on a second run;
//   - the whole layer through ops::sla: rel L2 <= 1e-2, cosine >= 0.9999
//     against the CPU layer; the dense limit (topk 1, proj_l 0) against exact
//     attention; tiny sequences (less than one block -> one block);
//   - the Wan DiT forward on CUDA with --attention sla against the CPU forward
//     with sla (random weights with random proj_l, head_dim 64, 512 tokens):
//     rel L2 <= 2e-2 (issue 7's GPU bar); sla with topk 1 and proj_l 0 against
//     original on CUDA: rel L2 <= 1e-2;
//   - sagesla (64 x 128 blocks, the SageAttention-style kernel) where the build
//     has it: cosine >= 0.999 against the CPU layer; a clear error otherwise;
//     every variant (radix top-k, linear branch overlapped on a second stream)
//     the same bits as the default; the linear branch in two halves (also
//     across two streams) the same bits as in one call.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/dtype.h"
#include "harness/harness.h"
#include "kernels/attention/attention.h"
#include "kernels/sage_attention/sage_attention.h"
#include "kernels/sage_attention/sage_prepass.h"
#include "kernels/sla/sla.h"
#include "models/wan/wan_dit.h"
#include "models/wan/wan_random.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/sla.h"

namespace td {
namespace {

using kernels::SlaFeatureMap;
using kernels::SlaProblem;
using kernels::Status;

constexpr double kMaxRelL2 = 1e-2;

kernels::AttnStrides strides_of(const Tensor& t) { return {t.strides()[0], t.strides()[2], t.strides()[1]}; }

// One problem: host BF16 base tensors ([B, L, H, D] or [B, H, L, D] storage),
// their [B, L, H, D] views on host (f32 copies) and device (bf16).
struct Inputs {
  int64_t B, L, H, D;
  bool bhld;
  Tensor qh, kh, vh;  // host f32 views [B, L, H, D]
  Tensor qd, kd, vd;  // device bf16 views [B, L, H, D]
};

Tensor blhd_view(const Tensor& base, bool bhld) { return bhld ? base.permute({0, 2, 1, 3}) : base; }

Inputs make_inputs(int64_t B, int64_t L, int64_t H, int64_t D, bool bhld) {
  Inputs in{B, L, H, D, bhld, {}, {}, {}, {}, {}, {}};
  const Shape shape = bhld ? Shape{B, H, L, D} : Shape{B, L, H, D};
  const Tensor q = test::randn_tensor(shape, DType::BF16);
  const Tensor k = test::randn_tensor(shape, DType::BF16, 1.f, 0.75f);  // a shared key offset
  const Tensor v = test::randn_tensor(shape, DType::BF16, 1.f, 0.25f);
  in.qh = blhd_view(q.to(DType::F32), bhld);
  in.kh = blhd_view(k.to(DType::F32), bhld);
  in.vh = blhd_view(v.to(DType::F32), bhld);
  in.qd = blhd_view(q.to(Device::cuda(0)), bhld);
  in.kd = blhd_view(k.to(Device::cuda(0)), bhld);
  in.vd = blhd_view(v.to(Device::cuda(0)), bhld);
  return in;
}

SlaProblem problem(const Inputs& in, const Tensor& q, const Tensor& k, const Tensor& v, double topk,
                   int64_t block_q = 128, int64_t block_k = 64, SlaFeatureMap fm = SlaFeatureMap::Softmax) {
  SlaProblem p;
  p.batch = in.B;
  p.heads = in.H;
  p.len = in.L;
  p.head_dim = in.D;
  p.q = strides_of(q);
  p.k = strides_of(k);
  p.v = strides_of(v);
  p.o = kernels::attn_contiguous_strides(kernels::AttnLayout::BLHD, in.H, in.L, in.D);
  p.scale = float(1.0 / std::sqrt(double(in.D)));
  p.block_q = block_q;
  p.block_k = block_k;
  p.topk = topk;
  p.feature_map = fm;
  return p;
}

Tensor device_buffer(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, Device::cuda(0));
  test::poison(t);
  return t;
}

template <typename T>
std::vector<T> download(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  return std::vector<T>(h.data<T>(), h.data<T>() + h.numel());
}

double at(const Tensor& h, int64_t b, int64_t t, int64_t hh, int64_t c) {
  const auto& s = h.strides();
  return h.data<float>()[b * s[0] + t * s[1] + hh * s[2] + c * s[3]];
}

// fp64 pooled scores [B, H, QB, KB] from the host f32 views.
std::vector<double> ref_scores(const Inputs& in, const SlaProblem& p) {
  const int64_t QB = p.query_blocks(), KB = p.key_blocks(), D = in.D, L = in.L;
  std::vector<double> out(size_t(in.B * in.H * QB * KB));
  for (int64_t b = 0; b < in.B; ++b)
    for (int64_t h = 0; h < in.H; ++h) {
      std::vector<double> mean(size_t(D), 0.0), pq(size_t(QB * D), 0.0), pk(size_t(KB * D), 0.0);
      for (int64_t t = 0; t < L; ++t)
        for (int64_t c = 0; c < D; ++c) mean[size_t(c)] += at(in.kh, b, t, h, c) / double(L);
      for (int64_t t = 0; t < L; ++t)
        for (int64_t c = 0; c < D; ++c) {
          const int64_t i = t / p.block_q, j = t / p.block_k;
          const double nq = double(std::min(L, (i + 1) * p.block_q) - i * p.block_q);
          const double nk = double(std::min(L, (j + 1) * p.block_k) - j * p.block_k);
          pq[size_t(i * D + c)] += at(in.qh, b, t, h, c) / nq;
          pk[size_t(j * D + c)] += (at(in.kh, b, t, h, c) - mean[size_t(c)]) / nk;
        }
      for (int64_t i = 0; i < QB; ++i)
        for (int64_t j = 0; j < KB; ++j) {
          double s = 0;
          for (int64_t c = 0; c < D; ++c) s += pq[size_t(i * D + c)] * pk[size_t(j * D + c)];
          out[size_t(((b * in.H + h) * QB + i) * KB + j)] = s;
        }
    }
  return out;
}

struct SelectCase {
  int64_t B, L, H, D, block_q, block_k;
  double topk;
  bool bhld;
};

// A GPU selection (LUT and map) against the CPU reference's LUT, up to ties
// (see the file comment for the bar).
void expect_selection_matches_reference(const Inputs& in, const SlaProblem& pd, const SlaProblem& ph,
                                        const std::vector<int32_t>& glut, const std::vector<uint8_t>& gmap);

void check_selection(const SelectCase& c, kernels::SlaTopkAlgo algo,
                     kernels::SlaScoreKernel score = kernels::SlaScoreKernel::Simple) {
  SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D << " blocks "
                                  << c.block_q << "x" << c.block_k << " topk " << c.topk << (c.bhld ? " BHLD" : " BLHD")
                                  << (algo == kernels::SlaTopkAlgo::Radix      ? " radix"
                                      : algo == kernels::SlaTopkAlgo::RadixCta ? " radix (CTA per row)"
                                                                               : " bitonic")
                                  << (score == kernels::SlaScoreKernel::Tiled ? " tiled score" : " simple score"));
  const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.bhld);
  SlaProblem pd = problem(in, in.qd, in.kd, in.vd, c.topk, c.block_q, c.block_k);
  pd.topk_algo = algo;
  pd.score_kernel = score;
  const SlaProblem ph = problem(in, in.qh, in.kh, in.vh, c.topk, c.block_q, c.block_k);
  const int64_t QB = pd.query_blocks(), KB = pd.key_blocks(), rows = c.B * c.H * QB;
  const int64_t n_sel = kernels::sla_selected_blocks(c.topk, KB);
  Tensor lut = device_buffer({rows, n_sel}, DType::I32), map = device_buffer({rows, KB}, DType::U8);
  const size_t ws_bytes = kernels::sla_block_select_workspace_size(pd);
  Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, Device::cuda(0));
  ASSERT_EQ(kernels::sla_block_select_cuda(pd, in.qd.raw_data(), in.kd.raw_data(), map.data<uint8_t>(),
                                           lut.data<int32_t>(), ws.raw_data(), ws_bytes, cuda::current_stream()),
            Status::Ok)
      << kernels::sla_last_error();
  expect_selection_matches_reference(in, pd, ph, download<int32_t>(lut), download<uint8_t>(map));
}

void expect_selection_matches_reference(const Inputs& in, const SlaProblem& pd, const SlaProblem& ph,
                                        const std::vector<int32_t>& glut, const std::vector<uint8_t>& gmap) {
  const int64_t QB = pd.query_blocks(), KB = pd.key_blocks(), rows = in.B * in.H * QB;
  const int64_t n_sel = kernels::sla_selected_blocks(pd.topk, KB);
  std::vector<int32_t> rlut(size_t(rows * n_sel));
  ASSERT_EQ(kernels::sla_block_map_cpu(ph, in.qh.data<float>(), in.kh.data<float>(), nullptr, rlut.data()),
            Status::Ok);
  const auto scores = ref_scores(in, pd);
  int64_t differing_rows = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> s(scores.begin() + r * KB, scores.begin() + (r + 1) * KB), sorted = s;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const double kth = sorted[size_t(n_sel - 1)], span = std::max(1e-30, sorted.front() - sorted.back());
    std::vector<int32_t> g(glut.begin() + r * n_sel, glut.begin() + (r + 1) * n_sel);
    std::vector<int32_t> ref(rlut.begin() + r * n_sel, rlut.begin() + (r + 1) * n_sel);
    int64_t ones = 0;
    for (int64_t j = 0; j < KB; ++j) {
      ASSERT_TRUE(gmap[size_t(r * KB + j)] <= 1) << "row " << r << " map " << int(gmap[size_t(r * KB + j)]);
      ones += gmap[size_t(r * KB + j)];
    }
    EXPECT_EQ(ones, n_sel) << "row " << r;
    for (int32_t j : g) {
      ASSERT_TRUE(j >= 0 && j < KB) << "row " << r << " LUT entry " << j;
      EXPECT_EQ(gmap[size_t(r * KB + j)], 1) << "row " << r << " block " << j << " in the LUT, not the map";
      EXPECT_GE(s[size_t(j)], kth - 1e-4 * span) << "row " << r << " block " << j << " is not a near-tie";
    }
    std::sort(g.begin(), g.end());
    EXPECT_TRUE(std::adjacent_find(g.begin(), g.end()) == g.end()) << "row " << r << " repeats a block";
    std::sort(ref.begin(), ref.end());
    differing_rows += g != ref;
  }
  EXPECT_LE(differing_rows, std::max<int64_t>(1, rows / 100)) << "of " << rows << " rows";
}

// The Tiled score GEMM (SlaScoreKernel::Tiled) against the reference (both
// top-k algorithms), and its LUT and map equal to the Simple kernel's bit for
// bit (the same fp32 scores): topk 1 lists every key block by score, so any
// score that moved past a neighbour would show. head_dim 48 and 36 exercise
// the zero-padded last channel slice (36: a float4 slice of 4, not 32).
TEST(SlaGpu, TiledScoreKernelEqualsSimpleExactly) {
  TD_REQUIRE_GPU();
  for (const auto algo : {kernels::SlaTopkAlgo::Bitonic, kernels::SlaTopkAlgo::Radix}) {
    check_selection({1, 1000, 3, 128, 128, 64, 0.1, false}, algo, kernels::SlaScoreKernel::Tiled);
    check_selection({2, 1537, 2, 64, 128, 64, 0.2, true}, algo, kernels::SlaScoreKernel::Tiled);
    check_selection({1, 777, 2, 128, 64, 128, 0.15, false}, algo, kernels::SlaScoreKernel::Tiled);
    check_selection({1, 203, 3, 48, 32, 16, 0.3, true}, algo, kernels::SlaScoreKernel::Tiled);
    check_selection({1, 5, 2, 64, 128, 64, 0.05, false}, algo, kernels::SlaScoreKernel::Tiled);
    check_selection({1, 32760, 1, 128, 64, 128, 0.1, false}, algo, kernels::SlaScoreKernel::Tiled);
  }
  struct Case {
    int64_t B, L, H, D, block_q, block_k;
    double topk;
  };
  for (const Case& c : {Case{1, 4099, 2, 128, 64, 128, 1.0}, Case{2, 3001, 3, 64, 128, 64, 0.3},
                        Case{1, 5000, 2, 36, 64, 32, 1.0}, Case{1, 70000, 1, 128, 128, 32, 0.25},
                        Case{1, 333, 5, 48, 16, 16, 0.5}}) {
    SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D << " blocks "
                                    << c.block_q << "x" << c.block_k << " topk " << c.topk);
    const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.B > 1);
    SlaProblem p = problem(in, in.qd, in.kd, in.vd, c.topk, c.block_q, c.block_k);
    const int64_t rows = c.B * c.H * p.query_blocks(), KB = p.key_blocks();
    const int64_t n_sel = kernels::sla_selected_blocks(c.topk, KB);
    const size_t ws_bytes = kernels::sla_block_select_workspace_size(p);
    Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, Device::cuda(0));
    std::vector<int32_t> luts[2];
    std::vector<uint8_t> maps[2];
    for (int a = 0; a < 2; ++a) {
      p.score_kernel = a == 0 ? kernels::SlaScoreKernel::Simple : kernels::SlaScoreKernel::Tiled;
      test::poison(ws);
      Tensor lut = device_buffer({rows, n_sel}, DType::I32), map = device_buffer({rows, KB}, DType::U8);
      ASSERT_EQ(kernels::sla_block_select_cuda(p, in.qd.raw_data(), in.kd.raw_data(), map.data<uint8_t>(),
                                               lut.data<int32_t>(), ws.raw_data(), ws_bytes, cuda::current_stream()),
                Status::Ok)
          << kernels::sla_last_error();
      luts[a] = download<int32_t>(lut);
      maps[a] = download<uint8_t>(map);
    }
    EXPECT_TRUE(luts[0] == luts[1]) << "the Tiled score kernel's LUT differs from the Simple kernel's";
    EXPECT_TRUE(maps[0] == maps[1]) << "the Tiled score kernel's map differs from the Simple kernel's";
  }
}

// Every top-k variant (the bitonic sort and the radix select, a warp or a
// CTA per row) against the reference.
TEST(SlaGpu, BlockSelectionMatchesTheReferenceUpToTies) {
  TD_REQUIRE_GPU();
  for (const auto algo : {kernels::SlaTopkAlgo::Bitonic, kernels::SlaTopkAlgo::Radix, kernels::SlaTopkAlgo::RadixCta}) {
    check_selection({1, 1000, 3, 128, 128, 64, 0.1, false}, algo);
    check_selection({2, 1537, 2, 64, 128, 64, 0.2, true}, algo);
    check_selection({1, 777, 2, 128, 64, 128, 0.15, false}, algo);  // sagesla's sm90 blocks
    check_selection({1, 203, 3, 48, 32, 16, 0.3, true}, algo);      // any head_dim
    check_selection({1, 5, 2, 64, 128, 64, 0.05, false}, algo);     // one block each way
    check_selection({1, 32760, 1, 128, 128, 64, 0.1, false}, algo); // Wan 480p: 512 key blocks
    check_selection({1, 9000, 1, 64, 64, 128, 1.0, false}, algo);   // topk 1: every block, by score
  }
}

// The radix select (a warp per row, and a CTA per row) gives the bitonic
// sort's LUT and map bit for bit (same scores, same total order), also where
// everything ties (Q = 0: every score is 0, so the LUT is 0..n_sel-1), at Wan
// 14B 720p's 591 key blocks, where n_sel > 640 (the warp kernel hands the rows
// to the CTA kernel), where a row has > 1024 key blocks (the same) and where
// n_sel > 1024 (radix falls back to the sort).
TEST(SlaGpu, RadixTopkEqualsBitonicTopkExactly) {
  TD_REQUIRE_GPU();
  struct Case {
    int64_t L, H, D, block_q, block_k;
    double topk;
    bool zero_q;
  };
  for (const Case& c : {Case{4099, 2, 128, 64, 128, 0.1, false}, Case{4099, 2, 128, 64, 128, 0.2, true},
                        Case{3001, 3, 64, 128, 64, 0.3, false}, Case{70000, 1, 64, 128, 32, 0.5, false},
                        Case{700, 1, 64, 64, 16, 0.7, true}, Case{75600, 1, 64, 512, 128, 0.1, false},
                        Case{75600, 1, 64, 1024, 128, 0.2, true}, Case{64000, 1, 64, 2048, 64, 0.7, false}}) {
    SCOPED_TRACE(testing::Message() << "L" << c.L << " H" << c.H << " D" << c.D << " blocks " << c.block_q << "x"
                                    << c.block_k << " topk " << c.topk << (c.zero_q ? " Q=0" : ""));
    Inputs in = make_inputs(1, c.L, c.H, c.D, false);
    if (c.zero_q) in.qd = Tensor::zeros({1, c.L, c.H, c.D}, DType::BF16, Device::cuda(0));
    SlaProblem p = problem(in, in.qd, in.kd, in.vd, c.topk, c.block_q, c.block_k);
    const int64_t QB = p.query_blocks(), KB = p.key_blocks(), rows = c.H * QB;
    const int64_t n_sel = kernels::sla_selected_blocks(c.topk, KB);
    const size_t ws_bytes = kernels::sla_block_select_workspace_size(p);
    Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, Device::cuda(0));
    std::vector<int32_t> luts[3];
    std::vector<uint8_t> maps[3];
    for (int a = 0; a < 3; ++a) {
      p.topk_algo = a == 0 ? kernels::SlaTopkAlgo::Bitonic : a == 1 ? kernels::SlaTopkAlgo::Radix
                                                                    : kernels::SlaTopkAlgo::RadixCta;
      Tensor lut = device_buffer({rows, n_sel}, DType::I32), map = device_buffer({rows, KB}, DType::U8);
      ASSERT_EQ(kernels::sla_block_select_cuda(p, in.qd.raw_data(), in.kd.raw_data(), map.data<uint8_t>(),
                                               lut.data<int32_t>(), ws.raw_data(), ws_bytes, cuda::current_stream()),
                Status::Ok)
          << kernels::sla_last_error();
      luts[a] = download<int32_t>(lut);
      maps[a] = download<uint8_t>(map);
    }
    EXPECT_TRUE(luts[0] == luts[1]) << "the radix LUT differs from the bitonic LUT";
    EXPECT_TRUE(maps[0] == maps[1]) << "the radix map differs from the bitonic map";
    EXPECT_TRUE(luts[0] == luts[2]) << "the radix (CTA per row) LUT differs from the bitonic LUT";
    EXPECT_TRUE(maps[0] == maps[2]) << "the radix (CTA per row) map differs from the bitonic map";
    if (c.zero_q)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t s = 0; s < n_sel; ++s)
          ASSERT_EQ(luts[1][size_t(r * n_sel + s)], int32_t(s)) << "all-tie row " << r << " position " << s;
  }
}

// fp64 block-sparse attention with the LUT, [B, L, H, D] and LSE [B, H, L].
void ref_sparse(const Inputs& in, const SlaProblem& p, const std::vector<int32_t>& lut, int64_t n_sel,
                std::vector<double>& o, std::vector<double>& lse) {
  const int64_t L = in.L, D = in.D, QB = p.query_blocks();
  o.assign(size_t(in.B * L * in.H * D), 0.0);
  lse.assign(size_t(in.B * in.H * L), 0.0);
  for (int64_t b = 0; b < in.B; ++b)
    for (int64_t h = 0; h < in.H; ++h)
      for (int64_t t = 0; t < L; ++t) {
        const int32_t* row = lut.data() + ((b * in.H + h) * QB + t / p.block_q) * n_sel;
        std::vector<int64_t> keys;
        for (int64_t e = 0; e < n_sel; ++e)
          for (int64_t u = row[e] * p.block_k; u < std::min(L, (row[e] + 1) * p.block_k); ++u) keys.push_back(u);
        std::vector<double> s(keys.size());
        double mx = -INFINITY;
        for (size_t n = 0; n < keys.size(); ++n) {
          double d = 0;
          for (int64_t c = 0; c < D; ++c) d += at(in.qh, b, t, h, c) * at(in.kh, b, keys[n], h, c);
          s[n] = d * p.scale;
          mx = std::max(mx, s[n]);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        double* orow = o.data() + ((b * L + t) * in.H + h) * D;
        for (size_t n = 0; n < keys.size(); ++n)
          for (int64_t c = 0; c < D; ++c) orow[c] += s[n] / sum * at(in.vh, b, keys[n], h, c);
        lse[size_t((b * in.H + h) * L + t)] = mx + std::log(sum);
      }
}

std::vector<double> as_f64(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<double> out(size_t(h.numel()));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = h.dtype() == DType::F32 ? double(h.data<float>()[i]) : double(bf16_to_f32(h.data<uint16_t>()[i]));
  return out;
}

struct SparseCase {
  int64_t B, L, H, D;
  double topk;
  bool bhld;
};

TEST(SlaGpu, SparseBranchMatchesFp64BlockSparseAttention) {
  TD_REQUIRE_GPU();
  for (const SparseCase& c : {SparseCase{1, 1000, 2, 128, 0.1, false}, SparseCase{2, 1537, 2, 64, 0.25, true},
                              SparseCase{1, 77, 3, 128, 0.5, false}, SparseCase{1, 4000, 1, 128, 0.05, true}}) {
    SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D << " topk " << c.topk);
    const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.bhld);
    const SlaProblem pd = problem(in, in.qd, in.kd, in.vd, c.topk);
    const SlaProblem ph = problem(in, in.qh, in.kh, in.vh, c.topk);
    const int64_t n_sel = kernels::sla_selected_blocks(c.topk, pd.key_blocks());
    std::vector<int32_t> lut(size_t(c.B * c.H * pd.query_blocks() * n_sel));
    ASSERT_EQ(kernels::sla_block_map_cpu(ph, in.qh.data<float>(), in.kh.data<float>(), nullptr, lut.data()),
              Status::Ok);
    Tensor lut_d = Tensor::empty({int64_t(lut.size())}, DType::I32, Device::cuda(0));
    cuda::memcpy_sync(lut_d.raw_data(), lut.data(), lut.size() * 4, true);
    Tensor o = device_buffer({c.B, c.L, c.H, c.D}, DType::BF16), lse = device_buffer({c.B, c.H, c.L}, DType::F32);
    ASSERT_EQ(kernels::sla_sparse_cuda(pd, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(), lut_d.data<int32_t>(),
                                       n_sel, o.raw_data(), lse.data<float>(), cuda::current_stream()),
              Status::Ok)
        << kernels::sla_last_error();
    std::vector<double> ro, rl;
    ref_sparse(in, pd, lut, n_sel, ro, rl);
    const auto acc = test::compare(as_f64(o), ro);
    std::printf("sparse L%lld D%lld topk %.2f: %s\n", (long long)c.L, (long long)c.D, c.topk, acc.str().c_str());
    TD_EXPECT_CLOSE(acc, kMaxRelL2, 0.9999);
    const auto gl = as_f64(lse);
    double worst = 0;
    for (size_t i = 0; i < gl.size(); ++i) worst = std::max(worst, std::abs(gl[i] - rl[i]));
    EXPECT_LE(worst, 2e-3) << "LSE";
  }
}

TEST(SlaGpu, LinearBranchMatchesTheReferenceAndIsDeterministic) {
  TD_REQUIRE_GPU();
  struct C {
    int64_t B, L, H, D;
    SlaFeatureMap fm;
    bool bhld;
  };
  for (const C& c : {C{1, 1000, 2, 128, SlaFeatureMap::Softmax, false}, C{2, 1537, 2, 64, SlaFeatureMap::Elu, true},
                     C{1, 77, 3, 128, SlaFeatureMap::Relu, false}, C{1, 20000, 2, 128, SlaFeatureMap::Softmax, true},
                     C{1, 5, 1, 64, SlaFeatureMap::Softmax, false}}) {
    SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D << " fm " << int(c.fm));
    const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.bhld);
    const SlaProblem pd = problem(in, in.qd, in.kd, in.vd, 0.1, 128, 64, c.fm);
    const SlaProblem ph = problem(in, in.qh, in.kh, in.vh, 0.1, 128, 64, c.fm);
    std::vector<float> eye(size_t(c.D * c.D), 0.f);
    for (int64_t i = 0; i < c.D; ++i) eye[size_t(i * c.D + i)] = 1.f;
    const Tensor w = Tensor::from_f32({c.D, c.D}, eye).to(Device::cuda(0));
    const Tensor bias = Tensor::zeros({c.D}, DType::F32, Device::cuda(0));
    const size_t ws_bytes = kernels::sla_linear_workspace_size(pd);
    Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, Device::cuda(0));
    test::poison(ws);
    std::vector<Tensor> outs;
    for (int run = 0; run < 2; ++run) {
      Tensor o = Tensor::zeros({c.B, c.L, c.H, c.D}, DType::BF16, Device::cuda(0));
      ASSERT_EQ(kernels::sla_linear_add_cuda(pd, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(), w.raw_data(),
                                             bias.raw_data(), kernels::ElemType::F32, o.raw_data(), ws.raw_data(),
                                             ws_bytes, cuda::current_stream()),
                Status::Ok)
          << kernels::sla_last_error();
      outs.push_back(o.to(Device::cpu()));
    }
    Tensor ref = Tensor::empty({c.B, c.L, c.H, c.D}, DType::F32);
    ASSERT_EQ(kernels::sla_linear_cpu(ph, in.qh.data<float>(), in.kh.data<float>(), in.vh.data<float>(),
                                      ref.data<float>()),
              Status::Ok);
    const auto acc = test::compare(outs[0], ref);
    std::printf("linear L%lld D%lld fm %d: %s\n", (long long)c.L, (long long)c.D, int(c.fm), acc.str().c_str());
    TD_EXPECT_CLOSE(acc, kMaxRelL2, 0.9999);
    EXPECT_EQ(std::memcmp(outs[0].raw_data(), outs[1].raw_data(), size_t(outs[0].numel()) * 2), 0)
        << "two runs on the same input differ";
  }
}

// The Staged linear kernels (SlaLinearKernels::Staged: kv_partial and
// linear_apply) against the CPU reference (proj_l = identity onto a zero o:
// rel L2 <= 1e-2, cosine >= 0.9999, the Warp kernels' bar), the same bits on a
// second run, and against the Warp kernels onto a random o_s with a random
// proj_l (rel L2 <= 2e-3, cosine >= 0.99999: the same formulas, φ's row sums in
// another order, so last-place differences in a few bf16 values), Staged
// through the two-half entry points, Warp in one call. Lengths cover one
// partial tile (5, 77), many chunks (20000) and a partial last chunk.
TEST(SlaGpu, LinearBranchStagedKernelsMatchTheReference) {
  TD_REQUIRE_GPU();
  struct C {
    int64_t B, L, H, D;
    SlaFeatureMap fm;
    bool bhld;
  };
  for (const C& c : {C{1, 1000, 2, 128, SlaFeatureMap::Softmax, false}, C{2, 1537, 2, 64, SlaFeatureMap::Elu, true},
                     C{1, 77, 3, 128, SlaFeatureMap::Relu, false}, C{1, 20000, 2, 128, SlaFeatureMap::Softmax, true},
                     C{1, 5, 1, 64, SlaFeatureMap::Softmax, false}, C{1, 4133, 3, 64, SlaFeatureMap::Softmax, false}}) {
    SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D << " fm " << int(c.fm));
    const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.bhld);
    SlaProblem pd = problem(in, in.qd, in.kd, in.vd, 0.1, 128, 64, c.fm);
    const SlaProblem ph = problem(in, in.qh, in.kh, in.vh, 0.1, 128, 64, c.fm);
    std::vector<float> eye(size_t(c.D * c.D), 0.f);
    for (int64_t i = 0; i < c.D; ++i) eye[size_t(i * c.D + i)] = 1.f;
    const Tensor w = Tensor::from_f32({c.D, c.D}, eye).to(Device::cuda(0));
    const Tensor bias = Tensor::zeros({c.D}, DType::F32, Device::cuda(0));
    const size_t ws_bytes = kernels::sla_linear_workspace_size(pd);
    Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, Device::cuda(0));
    test::poison(ws);
    pd.linear_kernels = kernels::SlaLinearKernels::Staged;
    std::vector<Tensor> outs;
    for (int run = 0; run < 2; ++run) {
      Tensor o = Tensor::zeros({c.B, c.L, c.H, c.D}, DType::BF16, Device::cuda(0));
      ASSERT_EQ(kernels::sla_linear_add_cuda(pd, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(), w.raw_data(),
                                             bias.raw_data(), kernels::ElemType::F32, o.raw_data(), ws.raw_data(),
                                             ws_bytes, cuda::current_stream()),
                Status::Ok)
          << kernels::sla_last_error();
      outs.push_back(o.to(Device::cpu()));
    }
    Tensor ref = Tensor::empty({c.B, c.L, c.H, c.D}, DType::F32);
    ASSERT_EQ(kernels::sla_linear_cpu(ph, in.qh.data<float>(), in.kh.data<float>(), in.vh.data<float>(),
                                      ref.data<float>()),
              Status::Ok);
    const auto acc = test::compare(outs[0], ref);
    std::printf("linear staged L%lld D%lld fm %d: %s\n", (long long)c.L, (long long)c.D, int(c.fm), acc.str().c_str());
    TD_EXPECT_CLOSE(acc, kMaxRelL2, 0.9999);
    EXPECT_EQ(std::memcmp(outs[0].raw_data(), outs[1].raw_data(), size_t(outs[0].numel()) * 2), 0)
        << "two runs on the same input differ";
    // Onto a random o_s with a random proj_l: Staged (two halves) against Warp (one call).
    const Tensor wr = test::randn_tensor({c.D, c.D}, DType::F32, 0.1f).to(Device::cuda(0));
    const Tensor br = test::randn_tensor({c.D}, DType::F32, 0.1f).to(Device::cuda(0));
    const Tensor o0 = test::randn_tensor({c.B, c.L, c.H, c.D}, DType::BF16).to(Device::cuda(0));
    Tensor ow = o0.clone(), os = o0.clone();
    SlaProblem pw = pd;
    pw.linear_kernels = kernels::SlaLinearKernels::Warp;
    ASSERT_EQ(kernels::sla_linear_add_cuda(pw, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(), wr.raw_data(),
                                           br.raw_data(), kernels::ElemType::F32, ow.raw_data(), ws.raw_data(), ws_bytes,
                                           cuda::current_stream()),
              Status::Ok)
        << kernels::sla_last_error();
    ASSERT_EQ(kernels::sla_linear_prepare_cuda(pd, in.kd.raw_data(), in.vd.raw_data(), wr.raw_data(), br.raw_data(),
                                               kernels::ElemType::F32, ws.raw_data(), ws_bytes, cuda::current_stream()),
              Status::Ok)
        << kernels::sla_last_error();
    ASSERT_EQ(kernels::sla_linear_apply_cuda(pd, in.qd.raw_data(), os.raw_data(), ws.raw_data(), ws_bytes,
                                             cuda::current_stream()),
              Status::Ok)
        << kernels::sla_last_error();
    const auto acc2 = test::compare(os, ow);
    std::printf("linear staged vs warp onto o_s, L%lld D%lld: %s\n", (long long)c.L, (long long)c.D,
                acc2.str().c_str());
    TD_EXPECT_CLOSE(acc2, 2e-3, 0.99999);
  }
}

// StagedPersist (SlaLinearKernels::StagedPersist / TD_SLA_LINEAR=persist: the
// persistent apply and kv_project_rows): against the CPU linear branch (identity proj_l onto a zero o: rel L2 <= 1e-2,
// cosine >= 0.9999, NaN-poisoned workspace), bit for bit equal to the Staged
// apply onto the same random o_s with a random proj_l, and bit for bit equal to
// itself over two runs. Awkward lengths (5, 77, 1537, 4133, 20000), D 64 / 128,
// every feature map, several heads and batches so the CTAs' tile ranges cross
// heads (M reloaded mid-range) and cover fewer tiles than SMs.
TEST(SlaGpu, LinearApplyPersistEqualsStagedBitForBit) {
  TD_REQUIRE_GPU();
  struct C {
    int64_t B, L, H, D;
    SlaFeatureMap fm;
    bool bhld;
  };
  for (const C& c : {C{1, 1000, 2, 128, SlaFeatureMap::Softmax, false}, C{2, 1537, 2, 64, SlaFeatureMap::Elu, true},
                     C{1, 77, 3, 128, SlaFeatureMap::Relu, false}, C{1, 20000, 3, 128, SlaFeatureMap::Softmax, true},
                     C{1, 5, 1, 64, SlaFeatureMap::Softmax, false}, C{2, 4133, 3, 64, SlaFeatureMap::Softmax, false}}) {
    SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D << " fm " << int(c.fm));
    const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.bhld);
    SlaProblem pd = problem(in, in.qd, in.kd, in.vd, 0.1, 128, 64, c.fm);
    const SlaProblem ph = problem(in, in.qh, in.kh, in.vh, 0.1, 128, 64, c.fm);
    std::vector<float> eye(size_t(c.D * c.D), 0.f);
    for (int64_t i = 0; i < c.D; ++i) eye[size_t(i * c.D + i)] = 1.f;
    const Tensor w = Tensor::from_f32({c.D, c.D}, eye).to(Device::cuda(0));
    const Tensor bias = Tensor::zeros({c.D}, DType::F32, Device::cuda(0));
    const size_t ws_bytes = kernels::sla_linear_workspace_size(pd);
    Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, Device::cuda(0));
    test::poison(ws);
    pd.linear_kernels = kernels::SlaLinearKernels::StagedPersist;
    Tensor o = Tensor::zeros({c.B, c.L, c.H, c.D}, DType::BF16, Device::cuda(0));
    ASSERT_EQ(kernels::sla_linear_add_cuda(pd, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(), w.raw_data(),
                                           bias.raw_data(), kernels::ElemType::F32, o.raw_data(), ws.raw_data(),
                                           ws_bytes, cuda::current_stream()),
              Status::Ok)
        << kernels::sla_last_error();
    Tensor ref = Tensor::empty({c.B, c.L, c.H, c.D}, DType::F32);
    ASSERT_EQ(kernels::sla_linear_cpu(ph, in.qh.data<float>(), in.kh.data<float>(), in.vh.data<float>(),
                                      ref.data<float>()),
              Status::Ok);
    const auto acc = test::compare(o, ref);
    std::printf("linear persist L%lld D%lld fm %d: %s\n", (long long)c.L, (long long)c.D, int(c.fm), acc.str().c_str());
    TD_EXPECT_CLOSE(acc, kMaxRelL2, 0.9999);
    // Onto a random o_s with a random proj_l: Persist (twice) against Staged, bit for bit.
    const Tensor wr = test::randn_tensor({c.D, c.D}, DType::F32, 0.1f).to(Device::cuda(0));
    const Tensor br = test::randn_tensor({c.D}, DType::F32, 0.1f).to(Device::cuda(0));
    const Tensor o0 = test::randn_tensor({c.B, c.L, c.H, c.D}, DType::BF16).to(Device::cuda(0));
    SlaProblem pst = pd;
    pst.linear_kernels = kernels::SlaLinearKernels::Staged;
    ASSERT_EQ(kernels::sla_linear_prepare_cuda(pst, in.kd.raw_data(), in.vd.raw_data(), wr.raw_data(), br.raw_data(),
                                               kernels::ElemType::F32, ws.raw_data(), ws_bytes, cuda::current_stream()),
              Status::Ok)
        << kernels::sla_last_error();
    std::vector<std::vector<uint16_t>> outs;
    for (const auto kind : {kernels::SlaLinearKernels::Staged, kernels::SlaLinearKernels::StagedPersist,
                            kernels::SlaLinearKernels::StagedPersist}) {
      SlaProblem pa = pd;
      pa.linear_kernels = kind;
      Tensor os = o0.clone();
      ASSERT_EQ(kernels::sla_linear_apply_cuda(pa, in.qd.raw_data(), os.raw_data(), ws.raw_data(), ws_bytes,
                                               cuda::current_stream()),
                Status::Ok)
          << kernels::sla_last_error();
      outs.push_back(download<uint16_t>(os));
    }
    EXPECT_TRUE(outs[0] == outs[1]) << "Persist apply differs from Staged";
    EXPECT_TRUE(outs[1] == outs[2]) << "two Persist runs differ";
    // The K/V half: StagedPersist's kv_project_rows against Staged's kv_project, the
    // whole linear workspace byte for byte from identically poisoned buffers, with
    // and without the sage statistics (those compared too).
    for (const bool with_stats : {false, true}) {
      SCOPED_TRACE(with_stats ? "prepare with sage statistics" : "prepare");
      std::vector<std::vector<uint8_t>> wss, sts;
      for (const auto kind : {kernels::SlaLinearKernels::Staged, kernels::SlaLinearKernels::StagedPersist}) {
        SlaProblem pp = pd;
        pp.linear_kernels = kind;
        Tensor w2 = device_buffer({int64_t(ws_bytes)}, DType::U8);
        Tensor st = device_buffer({3, c.B * c.H, c.D}, DType::F32);
        if (with_stats) {
          kernels::SlaSageStats stats;
          stats.km = st.data<float>();
          stats.vscale = st.data<float>() + c.B * c.H * c.D;
          stats.vinv = st.data<float>() + 2 * c.B * c.H * c.D;
          ASSERT_EQ(kernels::sla_linear_prepare_stats_cuda(pp, in.kd.raw_data(), in.vd.raw_data(), wr.raw_data(),
                                                           br.raw_data(), kernels::ElemType::F32, stats, w2.raw_data(),
                                                           ws_bytes, cuda::current_stream()),
                    Status::Ok)
              << kernels::sla_last_error();
        } else {
          ASSERT_EQ(kernels::sla_linear_prepare_cuda(pp, in.kd.raw_data(), in.vd.raw_data(), wr.raw_data(), br.raw_data(),
                                                     kernels::ElemType::F32, w2.raw_data(), ws_bytes,
                                                     cuda::current_stream()),
                    Status::Ok)
              << kernels::sla_last_error();
        }
        wss.push_back(download<uint8_t>(w2));
        sts.push_back(download<uint8_t>(st));
      }
      size_t first = 0;
      while (first < wss[0].size() && wss[0][first] == wss[1][first]) ++first;
      EXPECT_EQ(first, wss[0].size()) << "kv_project_rows: the workspace differs from byte " << first;
      EXPECT_TRUE(sts[0] == sts[1]) << "kv_project_rows: the sage statistics differ";
    }
  }
}

// The linear branch in two halves (prepare: K/V; apply: Q and o) equals the
// one-call branch bit for bit, including with the prepare half on a second
// stream forked / joined with events (the overlapped SageSLA path).
TEST(SlaGpu, LinearBranchInTwoHalvesEqualsOneCall) {
  TD_REQUIRE_GPU();
  for (const auto& [L, D, fm] : {std::tuple<int64_t, int64_t, SlaFeatureMap>{1537, 128, SlaFeatureMap::Softmax},
                                 {333, 64, SlaFeatureMap::Elu}}) {
    SCOPED_TRACE(testing::Message() << "L" << L << " D" << D << " fm " << int(fm));
    const Inputs in = make_inputs(1, L, 3, D, true);
    const SlaProblem pd = problem(in, in.qd, in.kd, in.vd, 0.1, 128, 64, fm);
    const Tensor w = test::randn_tensor({D, D}, DType::F32, 0.1f).to(Device::cuda(0));
    const Tensor bias = test::randn_tensor({D}, DType::F32, 0.1f).to(Device::cuda(0));
    const Tensor o0 = test::randn_tensor({1, L, 3, D}, DType::BF16).to(Device::cuda(0));
    const size_t ws_bytes = kernels::sla_linear_workspace_size(pd);
    std::vector<Tensor> outs;
    for (int mode = 0; mode < 3; ++mode) {  // one call; two halves on one stream; K/V half on a second stream
      Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, Device::cuda(0));
      test::poison(ws);
      Tensor o = o0.clone();
      void* st = cuda::current_stream();
      if (mode == 0) {
        ASSERT_EQ(kernels::sla_linear_add_cuda(pd, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(), w.raw_data(),
                                               bias.raw_data(), kernels::ElemType::F32, o.raw_data(), ws.raw_data(),
                                               ws_bytes, st),
                  Status::Ok)
            << kernels::sla_last_error();
      } else {
        cuda::Stream aux(0);
        cuda::Event fork, join;
        void* prep_stream = mode == 2 ? aux.native() : st;
        if (mode == 2) ASSERT_EQ(kernels::sla_stream_wait(aux.native(), st, fork.native()), Status::Ok);
        ASSERT_EQ(kernels::sla_linear_prepare_cuda(pd, in.kd.raw_data(), in.vd.raw_data(), w.raw_data(),
                                                   bias.raw_data(), kernels::ElemType::F32, ws.raw_data(), ws_bytes,
                                                   prep_stream),
                  Status::Ok)
            << kernels::sla_last_error();
        if (mode == 2) ASSERT_EQ(kernels::sla_stream_wait(st, aux.native(), join.native()), Status::Ok);
        ASSERT_EQ(kernels::sla_linear_apply_cuda(pd, in.qd.raw_data(), o.raw_data(), ws.raw_data(), ws_bytes, st),
                  Status::Ok)
            << kernels::sla_last_error();
        cuda::synchronize(0);
      }
      outs.push_back(o.to(Device::cpu()));
    }
    for (int mode = 1; mode < 3; ++mode)
      EXPECT_EQ(std::memcmp(outs[0].raw_data(), outs[size_t(mode)].raw_data(), size_t(outs[0].numel()) * 2), 0)
          << "mode " << mode << " differs from the one-call linear branch";
  }
}

struct LayerCase {
  int64_t B, L, H, D;
  double topk;
  bool bhld, with_proj, bf16_proj;
  SlaFeatureMap fm;
};

void check_layer(const LayerCase& c, int64_t block_q, int64_t block_k, double max_rel_l2, double min_cos) {
  SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D << " topk " << c.topk
                                  << " blocks " << block_q << "x" << block_k << (c.bhld ? " BHLD" : " BLHD")
                                  << (c.with_proj ? " proj_l" : " no proj_l") << " fm " << int(c.fm));
  const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.bhld);
  Tensor w, b, wd, bd;
  if (c.with_proj) {
    w = test::randn_tensor({c.D, c.D}, DType::F32, 0.1f);
    b = test::randn_tensor({c.D}, DType::F32, 0.1f);
    if (c.bf16_proj) {  // the values bf16 holds, both sides
      w = w.to(DType::BF16);
      b = b.to(DType::BF16);
    }
    wd = w.to(Device::cuda(0));
    bd = b.to(Device::cuda(0));
    w = w.to(DType::F32);
    b = b.to(DType::F32);
  }
  ops::SlaOptions so;
  so.topk = c.topk;
  so.block_q = block_q;
  so.block_k = block_k;
  so.feature_map = c.fm;
  const Tensor ref = ops::sla(in.qh, in.kh, in.vh, w, b, so);
  const Tensor got = ops::sla(in.qd, in.kd, in.vd, wd, bd, so);
  ASSERT_EQ(got.dtype(), DType::BF16);
  const auto acc = test::compare(got, ref);
  std::printf("layer L%lld D%lld topk %.2f %lldx%lld: %s\n", (long long)c.L, (long long)c.D, c.topk,
              (long long)block_q, (long long)block_k, acc.str().c_str());
  TD_EXPECT_CLOSE(acc, max_rel_l2, min_cos);
}

TEST(SlaGpu, WholeLayerMatchesTheCpuLayer) {
  TD_REQUIRE_GPU();
  for (const LayerCase& c : {LayerCase{1, 1000, 2, 128, 0.1, false, true, false, SlaFeatureMap::Softmax},
                             LayerCase{2, 1537, 2, 64, 0.2, true, true, true, SlaFeatureMap::Softmax},
                             LayerCase{1, 777, 3, 128, 0.15, true, true, false, SlaFeatureMap::Elu},
                             LayerCase{1, 300, 2, 128, 0.3, false, false, false, SlaFeatureMap::Softmax},
                             LayerCase{1, 5, 2, 64, 0.05, false, true, false, SlaFeatureMap::Relu},     // < 1 block
                             LayerCase{1, 70, 1, 128, 0.05, true, true, false, SlaFeatureMap::Softmax}})  // 1 of 2
    check_layer(c, 128, 64, kMaxRelL2, 0.9999);
}

TEST(SlaGpu, DenseLimitEqualsExactAttention) {
  TD_REQUIRE_GPU();
  for (const auto& [L, D] : {std::pair<int64_t, int64_t>{1000, 128}, {333, 64}}) {
    const Inputs in = make_inputs(1, L, 2, D, false);
    ops::SlaOptions so;
    so.topk = 1.0;
    const Tensor got = ops::sla(in.qd, in.kd, in.vd, Tensor(), Tensor(), so);
    TD_EXPECT_CLOSE(test::compare(got, ops::attention(in.qh, in.kh, in.vh)), kMaxRelL2, 0.9999);
    TD_EXPECT_CLOSE(test::compare(got, ops::attention(in.qd, in.kd, in.vd)), kMaxRelL2, 0.9999);
  }
}

TEST(SlaGpu, SageSlaRunsOrSaysWhatIsMissing) {
  TD_REQUIRE_GPU();
  ops::SlaOptions sage;
  sage.block_q = 64;
  sage.block_k = 128;
  if (!ops::sla_cuda_available(sage)) {
    const Inputs in = make_inputs(1, 300, 2, 128, false);
    try {
      (void)ops::sla(in.qd, in.kd, in.vd, Tensor(), Tensor(), sage);
      ADD_FAILURE() << "sagesla ran without the sage kernel";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sage"), std::string::npos) << e.what();
    }
    GTEST_SKIP() << "this build has no SageAttention-style kernel: sagesla refused with a clear error";
  }
  // Bar (issue 6): sagesla cosine >= 0.999.
  check_layer({1, 1000, 2, 128, 0.1, false, true, false, SlaFeatureMap::Softmax}, 64, 128, 5e-2, 0.999);
  check_layer({1, 1537, 2, 128, 0.2, true, true, false, SlaFeatureMap::Softmax}, 64, 128, 5e-2, 0.999);
  check_layer({1, 1000, 2, 64, 0.1, false, false, false, SlaFeatureMap::Softmax}, 128, 64, 5e-2, 0.999);
}

// Every SageSLA variant (top-k bitonic / radix, linear branch in line /
// overlapped on a second stream) against the CPU layer (cosine >= 0.999) and
// bit for bit against the default path (they run the same kernels on the same LUT).
TEST(SlaGpu, SageSlaVariantsEqualTheDefault) {
  TD_REQUIRE_GPU();
  ops::SlaOptions so;
  so.block_q = 64;
  so.block_k = 128;
  so.topk = 0.15;
  if (!ops::sla_cuda_available(so)) GTEST_SKIP() << "this build has no SageAttention-style kernel";
  const int64_t L = 2113, H = 3, D = 128;
  const Inputs in = make_inputs(1, L, H, D, true);
  const Tensor w = test::randn_tensor({D, D}, DType::F32, 0.1f), b = test::randn_tensor({D}, DType::F32, 0.1f);
  const Tensor wd = w.to(Device::cuda(0)), bd = b.to(Device::cuda(0));
  const Tensor ref = ops::sla(in.qh, in.kh, in.vh, w, b, so);
  Tensor base;
  for (const auto algo : {kernels::SlaTopkAlgo::Bitonic, kernels::SlaTopkAlgo::Radix})
    for (const bool overlap : {false, true}) {
      SCOPED_TRACE(testing::Message() << (algo == kernels::SlaTopkAlgo::Radix ? "radix" : "bitonic")
                                      << (overlap ? " overlapped linear" : " in-line linear"));
      ops::SlaOptions v = so;
      v.topk_algo = algo;
      v.overlap_linear = overlap;
      const Tensor got = ops::sla(in.qd, in.kd, in.vd, wd, bd, v).to(Device::cpu());
      const auto acc = test::compare(got, ref);
      std::printf("sagesla variant %s%s: %s\n", algo == kernels::SlaTopkAlgo::Radix ? "radix" : "bitonic",
                  overlap ? "+overlap" : "", acc.str().c_str());
      TD_EXPECT_CLOSE(acc, 5e-2, 0.999);
      if (!base.defined())
        base = got;
      else
        EXPECT_EQ(std::memcmp(base.raw_data(), got.raw_data(), size_t(got.numel()) * 2), 0)
            << "differs from the bitonic, in-line path";
    }
}

// SageSLA's fused path, kernel level: sage_prepare_cuda with block sums, then
// sla_block_select_from_sums_cuda. The sums against fp64 (Σ q per 64 rows,
// Σ (k - mean) per 64 keys: |err| <= 1e-3 + 1e-4·|ref|, fp32 sums of 64 terms
// of |x| ~ 1-3), the LUT / map against the CPU reference up to ties (the same
// bar as the default selection), and prepare + attend equal to
// sage_attention_cuda bit for bit (the same quantized workspace and kernel),
// sparse with that LUT and dense, for the sm_90a and the portable backend.
TEST(SlaGpu, FusedSelectionFromSageSumsMatchesTheReference) {
  TD_REQUIRE_GPU();
  struct Case {
    int64_t B, L, H, D, block_q, block_k;
    double topk;
    bool bhld;
  };
  for (const Case& c : {Case{1, 2113, 3, 128, 64, 128, 0.15, true}, Case{2, 1000, 2, 64, 64, 128, 0.1, false},
                        Case{1, 1537, 2, 128, 128, 64, 0.2, false}, Case{1, 77, 3, 64, 128, 128, 0.5, true},
                        Case{1, 32760, 1, 128, 64, 128, 0.1, false}}) {
    for (const auto be : {kernels::SageBackend::Sm90, kernels::SageBackend::Portable}) {
      SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D << " blocks "
                                      << c.block_q << "x" << c.block_k << " topk " << c.topk
                                      << (c.bhld ? " BHLD" : " BLHD")
                                      << (be == kernels::SageBackend::Sm90 ? " sm90" : " portable"));
      const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.bhld);
      const SlaProblem pd = problem(in, in.qd, in.kd, in.vd, c.topk, c.block_q, c.block_k);
      const SlaProblem ph = problem(in, in.qh, in.kh, in.vh, c.topk, c.block_q, c.block_k);
      const int64_t QB = pd.query_blocks(), KB = pd.key_blocks(), rows = c.B * c.H * QB;
      const int64_t n_sel = kernels::sla_selected_blocks(c.topk, KB);
      kernels::AttnProblem ap;
      ap.batch = c.B;
      ap.heads = c.H;
      ap.len_q = ap.len_kv = c.L;
      ap.head_dim = c.D;
      ap.q = pd.q;
      ap.k = pd.k;
      ap.v = pd.v;
      ap.o = pd.o;
      ap.scale = pd.scale;
      ap.qkv_type = ap.o_type = kernels::ElemType::BF16;
      Tensor lut = device_buffer({rows, n_sel}, DType::I32), map = device_buffer({rows, KB}, DType::U8);
      kernels::SageSparse sp;
      sp.lut = lut.data<int32_t>();
      sp.n_sel = n_sel;
      sp.block_q = c.block_q;
      sp.block_k = c.block_k;
      if (kernels::sage_attention_supports(ap, &sp, be) != Status::Ok) {
        std::printf("skip %s: %s\n", be == kernels::SageBackend::Sm90 ? "sm90" : "portable",
                    kernels::attention_last_error());
        continue;
      }
      const size_t sage_bytes = kernels::sage_attention_workspace_size(ap, be);
      Tensor sage_ws = Tensor::empty({int64_t(sage_bytes)}, DType::U8, Device::cuda(0));
      const int64_t nb = kernels::sage_sum64_blocks(c.L);
      Tensor qsum = device_buffer({c.B * c.H, nb, c.D}, DType::F32), ksum = device_buffer({c.B * c.H, nb, c.D}, DType::F32);
      kernels::SagePoolSums sums;
      sums.q_sum64 = qsum.data<float>();
      sums.k_sum64 = ksum.data<float>();
      void* st = cuda::current_stream();
      ASSERT_EQ(kernels::sage_prepare_cuda(ap, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(), &sp, be, sums,
                                           sage_ws.raw_data(), sage_bytes, st),
                Status::Ok)
          << kernels::attention_last_error();
      const size_t sel_bytes = kernels::sla_block_select_workspace_size(pd);
      Tensor sel_ws = Tensor::empty({int64_t(sel_bytes)}, DType::U8, Device::cuda(0));
      ASSERT_EQ(kernels::sla_block_select_from_sums_cuda(pd, sums.q_sum64, nb, sums.k_sum64, nb, map.data<uint8_t>(),
                                                         lut.data<int32_t>(), sel_ws.raw_data(), sel_bytes, st),
                Status::Ok)
          << kernels::sla_last_error();
      // The sums against fp64.
      const auto gq = download<float>(qsum), gk = download<float>(ksum);
      double worst = 0;
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t h = 0; h < c.H; ++h) {
          std::vector<double> mean(size_t(c.D), 0.0);
          for (int64_t t = 0; t < c.L; ++t)
            for (int64_t ch = 0; ch < c.D; ++ch) mean[size_t(ch)] += at(in.kh, b, t, h, ch) / double(c.L);
          for (int64_t blk = 0; blk < nb; ++blk)
            for (int64_t ch = 0; ch < c.D; ++ch) {
              double rq = 0, rk = 0;
              for (int64_t t = blk * 64; t < std::min(c.L, blk * 64 + 64); ++t) {
                rq += at(in.qh, b, t, h, ch);
                rk += at(in.kh, b, t, h, ch) - mean[size_t(ch)];
              }
              const size_t i = size_t(((b * c.H + h) * nb + blk) * c.D + ch);
              worst = std::max(worst, std::abs(gq[i] - rq) / (1e-3 + 1e-4 * std::abs(rq)));
              worst = std::max(worst, std::abs(gk[i] - rk) / (1e-3 + 1e-4 * std::abs(rk)));
            }
        }
      EXPECT_LE(worst, 1.0) << "block sums off by more than 1e-3 + 1e-4·|ref| (ratio " << worst << ")";
      expect_selection_matches_reference(in, pd, ph, download<int32_t>(lut), download<uint8_t>(map));
      // prepare + attend == sage_attention_cuda, sparse (this LUT) and dense.
      for (const bool sparse : {true, false}) {
        if (!sparse && kernels::sage_attention_supports(ap, nullptr, be) != Status::Ok) continue;
        const kernels::SageSparse* spp = sparse ? &sp : nullptr;
        Tensor o1 = device_buffer({c.B, c.L, c.H, c.D}, DType::BF16), o2 = device_buffer({c.B, c.L, c.H, c.D}, DType::BF16);
        ASSERT_EQ(kernels::sage_prepare_cuda(ap, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(), spp, be, sums,
                                             sage_ws.raw_data(), sage_bytes, st),
                  Status::Ok)
            << kernels::attention_last_error();
        ASSERT_EQ(kernels::sage_attend_cuda(ap, o1.raw_data(), nullptr, spp, be, sage_ws.raw_data(), sage_bytes, st),
                  Status::Ok)
            << kernels::attention_last_error();
        Tensor ws2 = Tensor::empty({int64_t(sage_bytes)}, DType::U8, Device::cuda(0));
        ASSERT_EQ(kernels::sage_attention_cuda(ap, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(), o2.raw_data(),
                                               nullptr, spp, be, ws2.raw_data(), sage_bytes, st),
                  Status::Ok)
            << kernels::attention_last_error();
        const Tensor h1 = o1.to(Device::cpu()), h2 = o2.to(Device::cpu());
        EXPECT_EQ(std::memcmp(h1.raw_data(), h2.raw_data(), size_t(h1.numel()) * 2), 0)
            << (sparse ? "sparse" : "dense") << ": prepare + attend differs from sage_attention_cuda";
      }
    }
  }
}

// The quantize pass's Direct kernel (SageQuantKernel::Direct / TD_SAGE_QUANT=
// direct, sage_prepass.h) against the Default kernel: the whole workspace
// (INT8 Q / K with their scales, q·km, the FP16 V or the permuted e4m3 Vᵀ, the
// padding rows, the statistics) and the block sums equal byte for byte, from
// identically poisoned buffers (so a byte one kernel leaves unwritten and the
// other writes shows up); two Direct runs equal each other (determinism), and
// a third on a grid of 3 CTAs (TD_SAGE_QUANT_CTAS=3: every CTA of the
// persistent kernel walks many blocks, through Q->Q, K->K, K->Q ... so the
// barriers that guard the reused shared memory are exercised) equals them; and
// attend on the Direct workspace equals sage_attention_cuda bit for bit (whose
// quantization SageAttentionGpu* check against sage_attention_cpu). Awkward
// lengths (77, 1000, 2113: partial 64-row blocks and 128 padding), D 64 / 128,
// BHLD / BLHD, with and without the sums, for the sm_90a layout (Vᵀ, e4m3) and
// the portable one (FP16 V).
TEST(SlaGpu, SageQuantDirectEqualsDefaultBitForBit) {
  TD_REQUIRE_GPU();
  struct Case {
    int64_t B, L, H, D;
    bool bhld;
  };
  for (const Case& c : {Case{1, 2113, 3, 128, true}, Case{2, 1000, 2, 64, false}, Case{1, 77, 3, 128, false},
                        Case{1, 77, 2, 64, true}, Case{1, 32760, 1, 128, false}}) {
    for (const auto be : {kernels::SageBackend::Sm90, kernels::SageBackend::Portable}) {
      const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.bhld);
      const SlaProblem pd = problem(in, in.qd, in.kd, in.vd, 0.2, 64, 128);
      const int64_t QB = pd.query_blocks(), KB = pd.key_blocks(), rows = c.B * c.H * QB;
      const int64_t n_sel = kernels::sla_selected_blocks(0.2, KB);
      kernels::AttnProblem ap;
      ap.batch = c.B;
      ap.heads = c.H;
      ap.len_q = ap.len_kv = c.L;
      ap.head_dim = c.D;
      ap.q = pd.q;
      ap.k = pd.k;
      ap.v = pd.v;
      ap.o = pd.o;
      ap.scale = pd.scale;
      ap.qkv_type = ap.o_type = kernels::ElemType::BF16;
      // Any in-range LUT: every query block attends to key blocks 0..n_sel-1.
      Tensor lut_h = Tensor::empty({rows, n_sel}, DType::I32);
      for (int64_t i = 0; i < rows * n_sel; ++i) lut_h.data<int32_t>()[i] = int32_t(i % n_sel);
      const Tensor lut = lut_h.to(Device::cuda(0));
      kernels::SageSparse sp;
      sp.lut = lut.data<int32_t>();
      sp.n_sel = n_sel;
      sp.block_q = 64;
      sp.block_k = 128;
      const kernels::SageSparse* spp = be == kernels::SageBackend::Sm90 ? &sp : nullptr;
      if (kernels::sage_attention_supports(ap, spp, be) != Status::Ok) {
        std::printf("skip %s: %s\n", be == kernels::SageBackend::Sm90 ? "sm90" : "portable",
                    kernels::attention_last_error());
        continue;
      }
      const size_t ws_bytes = kernels::sage_attention_workspace_size(ap, be);
      const int64_t nb = kernels::sage_sum64_blocks(c.L);
      void* st = cuda::current_stream();
      for (const bool with_sums : {true, false}) {
        SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D
                                        << (c.bhld ? " BHLD" : " BLHD")
                                        << (be == kernels::SageBackend::Sm90 ? " sm90" : " portable")
                                        << (with_sums ? " with sums" : " no sums"));
        std::vector<std::vector<uint8_t>> ws_out, sums_out;
        struct Run {
          kernels::SageQuantKernel kind;
          const char* ctas;  // TD_SAGE_QUANT_CTAS for the run, or none
        };
        const Run runs[] = {{kernels::SageQuantKernel::Default, nullptr},
                            {kernels::SageQuantKernel::Direct, nullptr},
                            {kernels::SageQuantKernel::Direct, nullptr},
                            {kernels::SageQuantKernel::Direct, "3"}};
        for (const Run& run : runs) {
          Tensor ws = device_buffer({int64_t(ws_bytes)}, DType::U8);
          Tensor sums = device_buffer({2, c.B * c.H, nb, c.D}, DType::F32);
          kernels::SagePoolSums ps;
          if (with_sums) {
            ps.q_sum64 = sums.data<float>();
            ps.k_sum64 = sums.data<float>() + c.B * c.H * nb * c.D;
          }
          ps.quant_kernel = run.kind;
          if (run.ctas) setenv("TD_SAGE_QUANT_CTAS", run.ctas, 1);
          const Status prepared = kernels::sage_prepare_cuda(ap, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(),
                                                             spp, be, ps, ws.raw_data(), ws_bytes, st);
          if (run.ctas) unsetenv("TD_SAGE_QUANT_CTAS");
          ASSERT_EQ(prepared, Status::Ok) << kernels::attention_last_error();
          ws_out.push_back(download<uint8_t>(ws));
          const Tensor sh = sums.to(Device::cpu());
          const auto* sb = static_cast<const uint8_t*>(sh.raw_data());
          sums_out.emplace_back(sb, sb + sh.nbytes());
          if (ws_out.size() == 2) {
            // attend on the Direct workspace == sage_attention_cuda.
            Tensor o1 = device_buffer({c.B, c.L, c.H, c.D}, DType::BF16), o2 = device_buffer({c.B, c.L, c.H, c.D}, DType::BF16);
            ASSERT_EQ(kernels::sage_attend_cuda(ap, o1.raw_data(), nullptr, spp, be, ws.raw_data(), ws_bytes, st),
                      Status::Ok)
                << kernels::attention_last_error();
            Tensor ws2 = Tensor::empty({int64_t(ws_bytes)}, DType::U8, Device::cuda(0));
            ASSERT_EQ(kernels::sage_attention_cuda(ap, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(),
                                                   o2.raw_data(), nullptr, spp, be, ws2.raw_data(), ws_bytes, st),
                      Status::Ok)
                << kernels::attention_last_error();
            EXPECT_TRUE(download<uint16_t>(o1) == download<uint16_t>(o2)) << "attend on the Direct workspace differs";
          }
        }
        for (size_t r = 1; r < ws_out.size(); ++r) {
          size_t first = 0;
          while (first < ws_out[0].size() && ws_out[0][first] == ws_out[r][first]) ++first;
          EXPECT_EQ(first, ws_out[0].size()) << "run " << r << ": workspace differs from the Default kernel's from byte "
                                             << first << " of " << ws_out[0].size();
          EXPECT_TRUE(sums_out[0] == sums_out[r]) << "run " << r << ": block sums differ";
        }
      }
    }
  }
}

// SageSLA's fused path through ops::sla (SlaOptions::fused) against the CPU
// layer (the sagesla bar: rel L2 <= 5e-2, cosine >= 0.999), with the linear
// branch in line and overlapped, block shapes 64 x 128 (the sm_90a kernel),
// 128 x 128 (portable) and 128 x 64 (the `sla` layer: Tiled score and Staged
// linear kernels only), proj_l and none; the same bits on a second run and with
// or without the overlap; and close to the default path (rel L2 <= 1e-2: the
// same quantization, a LUT that can differ only at near-ties).
TEST(SlaGpu, SageSlaFusedMatchesTheCpuLayerAndIsDeterministic) {
  TD_REQUIRE_GPU();
  struct Case {
    int64_t L, H, D, block_q, block_k;
    double topk;
    bool bhld, with_proj;
    kernels::SlaFeatureMap fm = kernels::SlaFeatureMap::Softmax;
  };
  using FM = kernels::SlaFeatureMap;
  for (const Case& c : {Case{2113, 3, 128, 64, 128, 0.15, true, true}, Case{1000, 2, 64, 64, 128, 0.1, false, true},
                        Case{1537, 2, 128, 128, 128, 0.2, false, true}, Case{1000, 2, 128, 128, 64, 0.2, true, true},
                        Case{300, 2, 128, 64, 128, 0.3, true, false},
                        Case{70, 1, 128, 64, 128, 0.05, false, true},
                        Case{777, 2, 128, 64, 128, 0.2, false, true, FM::Elu},
                        Case{901, 2, 64, 64, 128, 0.15, true, true, FM::Relu}}) {
    SCOPED_TRACE(testing::Message() << "L" << c.L << " H" << c.H << " D" << c.D << " blocks " << c.block_q << "x"
                                    << c.block_k << " topk " << c.topk << (c.bhld ? " BHLD" : " BLHD")
                                    << (c.with_proj ? " proj_l" : " no proj_l") << " feature map " << int(c.fm));
    const Inputs in = make_inputs(1, c.L, c.H, c.D, c.bhld);
    Tensor w, b, wd, bd;
    if (c.with_proj) {
      w = test::randn_tensor({c.D, c.D}, DType::F32, 0.1f);
      b = test::randn_tensor({c.D}, DType::F32, 0.1f);
      wd = w.to(Device::cuda(0));
      bd = b.to(Device::cuda(0));
    }
    ops::SlaOptions so;
    so.topk = c.topk;
    so.block_q = c.block_q;
    so.block_k = c.block_k;
    so.feature_map = c.fm;
    const Tensor ref = ops::sla(in.qh, in.kh, in.vh, w, b, so);
    ops::SlaOptions def = so;
    def.fused = false;
    const Tensor base = ops::sla(in.qd, in.kd, in.vd, wd, bd, def).to(Device::cpu());
    std::vector<Tensor> outs;
    for (const bool overlap : {true, false, true}) {
      ops::SlaOptions f = so;
      f.fused = true;
      f.overlap_linear = overlap;
      outs.push_back(ops::sla(in.qd, in.kd, in.vd, wd, bd, f).to(Device::cpu()));
    }
    const auto acc = test::compare(outs[0], ref);
    std::printf("sagesla fused L%lld D%lld %lldx%lld: %s\n", (long long)c.L, (long long)c.D, (long long)c.block_q,
                (long long)c.block_k, acc.str().c_str());
    TD_EXPECT_CLOSE(acc, 5e-2, 0.999);
    TD_EXPECT_CLOSE(test::compare(outs[0], base), 1e-2, 0.9999);
    for (size_t i = 1; i < outs.size(); ++i)
      EXPECT_EQ(std::memcmp(outs[0].raw_data(), outs[i].raw_data(), size_t(outs[0].numel()) * 2), 0)
          << "fused run " << i << " differs from the first";
    // fused_kv_stats (TD_SLA_FUSED=2): the sage statistics from the linear K/V
    // pass; the same bars, deterministic, close to plain fused (the K mean
    // summed in another order: INT8 K can move by a code at rounding edges).
    std::vector<Tensor> kvs;
    for (int run = 0; run < 2; ++run) {
      ops::SlaOptions f = so;
      f.fused = true;
      f.fused_kv_stats = true;
      kvs.push_back(ops::sla(in.qd, in.kd, in.vd, wd, bd, f).to(Device::cpu()));
    }
    const auto acc3 = test::compare(kvs[0], ref);
    std::printf("sagesla fused+kv-stats L%lld D%lld %lldx%lld: %s\n", (long long)c.L, (long long)c.D,
                (long long)c.block_q, (long long)c.block_k, acc3.str().c_str());
    TD_EXPECT_CLOSE(acc3, 5e-2, 0.999);
    TD_EXPECT_CLOSE(test::compare(kvs[0], outs[0]), 1e-2, 0.9999);
    EXPECT_EQ(std::memcmp(kvs[0].raw_data(), kvs[1].raw_data(), size_t(kvs[0].numel()) * 2), 0)
        << "fused+kv-stats: two runs differ";
  }
}

// sla_linear_prepare_stats_cuda: the sage statistics it writes against the
// sage pre-pass's own (sage_prepare_cuda then sage_stats_slots): V scales bit
// for bit (a max is order-free; the same formulas), K mean within 1e-5 + 1e-5·|km|
// (fp32 sums of L values in another order); and its M / Σφ(K) / bias the same
// bits as the Staged prepare without statistics (the same o after the apply).
TEST(SlaGpu, LinearPrepareWithSageStatsMatchesTheSagePrepass) {
  TD_REQUIRE_GPU();
  struct Case {
    int64_t B, L, H, D;
    bool bhld;
  };
  for (const Case& c : {Case{1, 2113, 3, 128, true}, Case{2, 1000, 2, 64, false}, Case{1, 77, 2, 128, false},
                        Case{1, 20000, 2, 128, false}}) {
    SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D);
    const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.bhld);
    SlaProblem pd = problem(in, in.qd, in.kd, in.vd, 0.1, 64, 128);
    pd.linear_kernels = kernels::SlaLinearKernels::Staged;
    kernels::AttnProblem ap;
    ap.batch = c.B;
    ap.heads = c.H;
    ap.len_q = ap.len_kv = c.L;
    ap.head_dim = c.D;
    ap.q = pd.q;
    ap.k = pd.k;
    ap.v = pd.v;
    ap.o = pd.o;
    ap.scale = pd.scale;
    ap.qkv_type = ap.o_type = kernels::ElemType::BF16;
    const auto be = kernels::SageBackend::Portable;  // the statistics are the same for both backends
    const size_t sage_bytes = kernels::sage_attention_workspace_size(ap, be);
    Tensor sage_ws = Tensor::empty({int64_t(sage_bytes)}, DType::U8, Device::cuda(0));
    test::poison(sage_ws);
    void* st = cuda::current_stream();
    ASSERT_EQ(kernels::sage_prepare_cuda(ap, in.qd.raw_data(), in.kd.raw_data(), in.vd.raw_data(), nullptr, be, {},
                                         sage_ws.raw_data(), sage_bytes, st),
              Status::Ok)
        << kernels::attention_last_error();
    const kernels::SageStatsSlots slots = kernels::sage_stats_slots(ap, be, sage_ws.raw_data());
    const int64_t n = c.B * c.H * c.D;
    Tensor mine = device_buffer({3, n}, DType::F32);
    kernels::SlaSageStats stats;
    stats.km = mine.data<float>();
    stats.vscale = mine.data<float>() + n;
    stats.vinv = mine.data<float>() + 2 * n;
    const Tensor w = test::randn_tensor({c.D, c.D}, DType::F32, 0.1f).to(Device::cuda(0));
    const Tensor bias = test::randn_tensor({c.D}, DType::F32, 0.1f).to(Device::cuda(0));
    const size_t ws_bytes = kernels::sla_linear_workspace_size(pd);
    Tensor ws1 = Tensor::empty({int64_t(ws_bytes)}, DType::U8, Device::cuda(0));
    Tensor ws2 = Tensor::empty({int64_t(ws_bytes)}, DType::U8, Device::cuda(0));
    test::poison(ws1);
    test::poison(ws2);
    ASSERT_EQ(kernels::sla_linear_prepare_stats_cuda(pd, in.kd.raw_data(), in.vd.raw_data(), w.raw_data(),
                                                     bias.raw_data(), kernels::ElemType::F32, stats, ws1.raw_data(),
                                                     ws_bytes, st),
              Status::Ok)
        << kernels::sla_last_error();
    ASSERT_EQ(kernels::sla_linear_prepare_cuda(pd, in.kd.raw_data(), in.vd.raw_data(), w.raw_data(), bias.raw_data(),
                                               kernels::ElemType::F32, ws2.raw_data(), ws_bytes, st),
              Status::Ok)
        << kernels::sla_last_error();
    auto slot = [&](const float* ptr) {  // a [B·H, D] slot of the sage workspace, to the host
      cuda::synchronize(0);
      std::vector<float> h(static_cast<size_t>(n));
      cuda::memcpy_sync(h.data(), ptr, size_t(n) * 4, false);
      return h;
    };
    const auto got = download<float>(mine);
    const auto km = slot(slots.km), vs = slot(slots.vscale), vi = slot(slots.vinv);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_LE(std::abs(double(got[size_t(i)]) - km[size_t(i)]), 1e-5 + 1e-5 * std::abs(km[size_t(i)])) << "km " << i;
      ASSERT_EQ(got[size_t(n + i)], vs[size_t(i)]) << "vscale " << i;
      ASSERT_EQ(got[size_t(2 * n + i)], vi[size_t(i)]) << "vinv " << i;
    }
    const Tensor o0 = test::randn_tensor({c.B, c.L, c.H, c.D}, DType::BF16).to(Device::cuda(0));
    Tensor o1 = o0.clone(), o2 = o0.clone();
    ASSERT_EQ(kernels::sla_linear_apply_cuda(pd, in.qd.raw_data(), o1.raw_data(), ws1.raw_data(), ws_bytes, st),
              Status::Ok);
    ASSERT_EQ(kernels::sla_linear_apply_cuda(pd, in.qd.raw_data(), o2.raw_data(), ws2.raw_data(), ws_bytes, st),
              Status::Ok);
    const Tensor h1 = o1.to(Device::cpu()), h2 = o2.to(Device::cpu());
    EXPECT_EQ(std::memcmp(h1.raw_data(), h2.raw_data(), size_t(h1.numel()) * 2), 0)
        << "the K/V pass with statistics changed the linear branch";
  }
}

// SageSLA's fused chain defers the projection (SlaSageStats::defer_projection)
// and runs it, then the apply, as programmatic dependents after the sparse
// kernel (sla_linear_project_apply_cuda, pdl.cuh). Against prepare with the
// statistics + apply in plain order: the same sage statistics, the same linear
// workspace byte for byte from identically poisoned buffers, the same o bit for
// bit, twice (determinism); bf16 and f32 proj_l; before the chained tail a
// kernel rewrites o (the sparse kernel's place), so an apply that read o before
// its wait would show.
TEST(SlaGpu, DeferredProjectionChainEqualsPrepareThenApply) {
  TD_REQUIRE_GPU();
  struct Case {
    int64_t B, L, H, D;
    bool bhld;
    bool bf16_proj;
  };
  for (const Case& c : {Case{1, 2113, 3, 128, true, false}, Case{2, 1000, 2, 64, false, true},
                        Case{1, 77, 2, 128, false, false}, Case{1, 32760, 2, 128, false, true}}) {
    SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D
                                    << (c.bf16_proj ? " bf16 proj_l" : " f32 proj_l"));
    const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.bhld);
    SlaProblem pd = problem(in, in.qd, in.kd, in.vd, 0.1, 64, 128);
    pd.linear_kernels = kernels::SlaLinearKernels::Staged;
    const DType wt = c.bf16_proj ? DType::BF16 : DType::F32;
    const kernels::ElemType et = c.bf16_proj ? kernels::ElemType::BF16 : kernels::ElemType::F32;
    const Tensor w = test::randn_tensor({c.D, c.D}, DType::F32, 0.1f).to(wt).to(Device::cuda(0));
    const Tensor bias = test::randn_tensor({c.D}, DType::F32, 0.1f).to(wt).to(Device::cuda(0));
    const Tensor o0 = test::randn_tensor({c.B, c.L, c.H, c.D}, DType::BF16).to(Device::cuda(0));
    const size_t ws_bytes = kernels::sla_linear_workspace_size(pd);
    void* st = cuda::current_stream();
    const int64_t n = c.B * c.H * c.D;
    std::vector<std::vector<uint8_t>> wss, sts;
    std::vector<std::vector<uint16_t>> outs;
    for (int run = 0; run < 3; ++run) {  // 0: plain order; 1, 2: the deferred chain
      const bool deferred = run > 0;
      Tensor ws = device_buffer({int64_t(ws_bytes)}, DType::U8);
      Tensor stt = device_buffer({3, n}, DType::F32);
      kernels::SlaSageStats stats;
      stats.km = stt.data<float>();
      stats.vscale = stt.data<float>() + n;
      stats.vinv = stt.data<float>() + 2 * n;
      stats.defer_projection = deferred;
      Tensor o = Tensor::zeros({c.B, c.L, c.H, c.D}, DType::BF16, Device::cuda(0));
      ASSERT_EQ(kernels::sla_linear_prepare_stats_cuda(pd, in.kd.raw_data(), in.vd.raw_data(), w.raw_data(),
                                                       bias.raw_data(), et, stats, ws.raw_data(), ws_bytes, st),
                Status::Ok)
          << kernels::sla_last_error();
      // o = o0 by a kernel right before the tail (o + o0 with o = 0: the same bits as o0).
      o = ops::add(o, o0);
      if (deferred) {
        ASSERT_EQ(kernels::sla_linear_project_apply_cuda(pd, in.qd.raw_data(), o.raw_data(), w.raw_data(),
                                                         bias.raw_data(), et, ws.raw_data(), ws_bytes, st),
                  Status::Ok)
            << kernels::sla_last_error();
      } else {
        ASSERT_EQ(kernels::sla_linear_apply_cuda(pd, in.qd.raw_data(), o.raw_data(), ws.raw_data(), ws_bytes, st),
                  Status::Ok)
            << kernels::sla_last_error();
      }
      wss.push_back(download<uint8_t>(ws));
      sts.push_back(download<uint8_t>(stt));
      outs.push_back(download<uint16_t>(o));
    }
    for (int run = 1; run < 3; ++run) {
      size_t first = 0;
      while (first < wss[0].size() && wss[0][first] == wss[size_t(run)][first]) ++first;
      EXPECT_EQ(first, wss[0].size()) << "run " << run << ": the linear workspace differs from byte " << first;
      EXPECT_TRUE(sts[0] == sts[size_t(run)]) << "run " << run << ": the sage statistics differ";
      EXPECT_TRUE(outs[0] == outs[size_t(run)]) << "run " << run << ": o differs";
    }
  }
}

TEST(SlaGpu, RefusesWhatItCannotRun) {
  TD_REQUIRE_GPU();
  const Inputs in = make_inputs(1, 100, 2, 48, false);  // the tiny DiT fixture's head_dim
  ops::SlaOptions so;
  try {
    (void)ops::sla(in.qd, in.kd, in.vd, Tensor(), Tensor(), so);
    ADD_FAILURE() << "head_dim 48 ran on the sla CUDA kernels";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
}

// SageSLA's fused selection (score_topk_fused_kernel, the default of
// sla_block_select_from_sums_cuda) against the two kernels it replaces
// (TD_SLA_SELECT=two_kernel: score_tiled_kernel<true>, then the radix top-k)
// and the bitonic sort (TD_SLA_TOPK=bitonic), LUT and map bit for bit, and all
// three against the host: the same pooled values and fmaf chain in fp32, keys
// sorted. Fresh random block sums (any fp32 values: not from the sage pass),
// key blocks copied onto their neighbours (tied scores in every row), query
// blocks copied (tied rows), an all-zero Q (every score ties); QB = 2, 5, 24,
// 27, 77, 154, 1182 (a partial last row group for every rows per CTA), KB = 1,
// 3, 20, 24, 77, 154, 256, 591, n_sel = 1, 25, 59, KB, head_dim 36 (channels
// zero-padded to different multiples by the two paths), 2 or 4 sums per block
// (and 3 Q sums of a 192-token block: n not a power of two), every rows-per-CTA
// variant (TD_SLA_SELECT=fused16 .. fused64), LUT only and map only, and rows
// past the fused kernel's limits (KB > 1024, n_sel > 640: the two kernels).
// LUT and map start poisoned, 0xFF for the references and 0x7F for the fused runs.
TEST(SlaGpu, FusedScoreTopkEqualsTwoKernelPathExactly) {
  TD_REQUIRE_GPU();
  struct EnvRestore {
    std::vector<std::pair<std::string, std::string>> saved;  // name, value ("" with no value: unset)
    std::vector<bool> had;
    explicit EnvRestore(std::initializer_list<const char*> names) {
      for (const char* n : names) {
        const char* v = std::getenv(n);
        saved.emplace_back(n, v ? v : "");
        had.push_back(v != nullptr);
      }
    }
    ~EnvRestore() {
      for (size_t i = 0; i < saved.size(); ++i)
        if (had[i]) setenv(saved[i].first.c_str(), saved[i].second.c_str(), 1);
        else unsetenv(saved[i].first.c_str());
    }
  } restore({"TD_SLA_SELECT", "TD_SLA_TOPK"});
  auto set_env = [](const char* name, const char* value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  };
  auto ordered = [](float s) {
    uint32_t u = 0;
    if (s != 0.f) std::memcpy(&u, &s, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  };
  struct Case {
    int64_t B, H, L, D, block_q, block_k;
    double topk;
    int ties;  // 0: none, 1: copied key and query blocks, 2: Q = 0
  };
  for (const Case& c : {Case{1, 3, 100, 128, 64, 128, 0.5, 0}, Case{2, 2, 300, 64, 64, 128, 1.0, 1},
                        Case{1, 2, 9806, 128, 64, 128, 0.33, 1}, Case{1, 2, 9806, 36, 128, 64, 1.0, 0},
                        Case{1, 2, 32760, 128, 64, 128, 0.1, 1}, Case{1, 1, 75600, 128, 64, 128, 0.1, 1},
                        Case{1, 2, 5000, 128, 192, 256, 0.3, 0}, Case{1, 2, 2000, 64, 64, 128, 0.7, 2},
                        Case{2, 4, 3000, 128, 128, 128, 0.6, 1}, Case{1, 1, 70000, 64, 2048, 64, 0.2, 0},
                        Case{1, 1, 64000, 64, 1024, 64, 0.7, 0}}) {
    SlaProblem p;
    p.batch = c.B;
    p.heads = c.H;
    p.len = c.L;
    p.head_dim = c.D;
    p.q = p.k = p.v = p.o = kernels::attn_contiguous_strides(kernels::AttnLayout::BLHD, c.H, c.L, c.D);
    p.scale = float(1.0 / std::sqrt(double(c.D)));
    p.block_q = c.block_q;
    p.block_k = c.block_k;
    p.topk = c.topk;
    const int64_t QB = p.query_blocks(), KB = p.key_blocks(), BH = c.B * c.H, rows = BH * QB;
    const int64_t n_sel = kernels::sla_selected_blocks(c.topk, KB);
    const int64_t q_sub = c.block_q / 64, k_sub = c.block_k / 64;
    const int64_t nbq = QB * q_sub + 3, nbk = KB * k_sub + 5;  // sums per (b, h): more than the blocks use
    SCOPED_TRACE(testing::Message() << "B" << c.B << " H" << c.H << " L" << c.L << " D" << c.D << " blocks "
                                    << c.block_q << "x" << c.block_k << " QB " << QB << " KB " << KB << " n_sel "
                                    << n_sel << (c.ties == 1 ? " copied blocks" : c.ties == 2 ? " Q = 0" : ""));
    Tensor qh = test::randn_tensor({BH, nbq, c.D}, DType::F32, 8.f);
    Tensor kh = test::randn_tensor({BH, nbk, c.D}, DType::F32, 8.f, 0.5f);
    float* const qv = qh.data<float>();
    float* const kv = kh.data<float>();
    if (c.ties == 2) std::fill(qv, qv + qh.numel(), 0.f);
    if (c.ties == 1)
      for (int64_t bh = 0; bh < BH; ++bh) {
        for (int64_t j = 0; j + 2 < KB; j += 3)  // full blocks: the same sums and tokens, the same pooled K
          std::memcpy(kv + (bh * nbk + (j + 1) * k_sub) * c.D, kv + (bh * nbk + j * k_sub) * c.D,
                      size_t(k_sub * c.D) * 4);
        for (int64_t i = 0; i + 2 < QB; i += 4)
          std::memcpy(qv + (bh * nbq + (i + 1) * q_sub) * c.D, qv + (bh * nbq + i * q_sub) * c.D,
                      size_t(q_sub * c.D) * 4);
      }
    const Tensor qd = qh.to(Device::cuda(0)), kd = kh.to(Device::cuda(0));

    // The host's LUT and map: pooled values and fmaf chains as the kernels form them.
    std::vector<int32_t> hlut(size_t(rows * n_sel));
    std::vector<uint8_t> hmap(size_t(rows * KB), 0);
    {
      auto pooled = [&](const float* sums, int64_t nb, int64_t bh, int64_t blk, int64_t sub, int64_t block) {
        std::vector<float> v(size_t(c.D));
        const float n = float(std::min(c.L, (blk + 1) * block) - blk * block);
        for (int64_t ch = 0; ch < c.D; ++ch) {
          float x = sums[(bh * nb + blk * sub) * c.D + ch];
          for (int64_t s = 1; s < sub; ++s) x += sums[(bh * nb + blk * sub + s) * c.D + ch];
          v[size_t(ch)] = x / n;
        }
        return v;
      };
      std::vector<uint64_t> keys(static_cast<size_t>(KB));
      for (int64_t bh = 0; bh < BH; ++bh) {
        std::vector<std::vector<float>> pk;
        for (int64_t j = 0; j < KB; ++j) pk.push_back(pooled(kv, nbk, bh, j, k_sub, c.block_k));
        for (int64_t i = 0; i < QB; ++i) {
          const std::vector<float> pq = pooled(qv, nbq, bh, i, q_sub, c.block_q);
          for (int64_t j = 0; j < KB; ++j) {
            float acc = 0.f;
            for (int64_t ch = 0; ch < c.D; ++ch) acc = std::fmaf(pq[size_t(ch)], pk[size_t(j)][size_t(ch)], acc);
            keys[size_t(j)] = (uint64_t(~ordered(acc)) << 32) | uint64_t(j);
          }
          std::partial_sort(keys.begin(), keys.begin() + n_sel, keys.end());
          const int64_t row = bh * QB + i;
          for (int64_t s = 0; s < n_sel; ++s) {
            hlut[size_t(row * n_sel + s)] = int32_t(uint32_t(keys[size_t(s)]));
            hmap[size_t(row * KB + int64_t(uint32_t(keys[size_t(s)])))] = 1;
          }
        }
      }
    }

    const size_t ws_bytes = kernels::sla_block_select_workspace_size(p);
    Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, Device::cuda(0));
    auto poisoned = [](const Shape& shape, DType dtype, uint8_t byte) {
      Tensor t = Tensor::empty(shape, dtype, Device::cuda(0));
      const std::vector<uint8_t> host(t.nbytes(), byte);
      cuda::memcpy_sync(t.raw_data(), host.data(), host.size(), true);
      return t;
    };
    // One selection: TD_SLA_SELECT / TD_SLA_TOPK as given (null: unset).
    auto run = [&](const char* select, const char* topk_env, bool want_lut, bool want_map, uint8_t poison,
                   std::vector<int32_t>& lut_out, std::vector<uint8_t>& map_out) {
      set_env("TD_SLA_SELECT", select);
      set_env("TD_SLA_TOPK", topk_env);
      Tensor lut = poisoned({rows, n_sel}, DType::I32, poison), map = poisoned({rows, KB}, DType::U8, poison);
      ASSERT_EQ(kernels::sla_block_select_from_sums_cuda(p, qd.data<float>(), nbq, kd.data<float>(), nbk,
                                                         want_map ? map.data<uint8_t>() : nullptr,
                                                         want_lut ? lut.data<int32_t>() : nullptr, ws.raw_data(),
                                                         ws_bytes, cuda::current_stream()),
                Status::Ok)
          << (select ? select : "default") << ": " << kernels::sla_last_error();
      lut_out = download<int32_t>(lut);
      map_out = download<uint8_t>(map);
    };
    std::vector<int32_t> ref_lut, bit_lut, lut;
    std::vector<uint8_t> ref_map, bit_map, map;
    run("two_kernel", nullptr, true, true, 0xFF, ref_lut, ref_map);
    EXPECT_TRUE(ref_lut == hlut) << "the two-kernel LUT differs from the host's";
    EXPECT_TRUE(ref_map == hmap) << "the two-kernel map differs from the host's";
    run("two_kernel", "bitonic", true, true, 0xFF, bit_lut, bit_map);
    EXPECT_TRUE(bit_lut == ref_lut) << "the bitonic LUT differs from the radix LUT";
    EXPECT_TRUE(bit_map == ref_map) << "the bitonic map differs from the radix map";
    for (const char* select :
         {static_cast<const char*>(nullptr), "fused", "fused16", "fused32", "fused48", "fused64",
          "fused_v3_16", "fused_v3_32", "fused_v3_48", "fused_v3_64"}) {
      SCOPED_TRACE(select ? select : "TD_SLA_SELECT unset");
      run(select, nullptr, true, true, 0x7F, lut, map);
      EXPECT_TRUE(lut == ref_lut) << "the fused LUT differs from the two-kernel LUT";
      EXPECT_TRUE(map == ref_map) << "the fused map differs from the two-kernel map";
    }
    run(nullptr, nullptr, true, false, 0x7F, lut, map);
    EXPECT_TRUE(lut == ref_lut) << "LUT only: the fused LUT differs";
    EXPECT_TRUE(std::all_of(map.begin(), map.end(), [](uint8_t x) { return x == 0x7F; })) << "LUT only: map written";
    run(nullptr, nullptr, false, true, 0x7F, lut, map);
    EXPECT_TRUE(map == ref_map) << "map only: the fused map differs";
    EXPECT_TRUE(std::all_of(lut.begin(), lut.end(), [](int32_t x) { return x == 0x7F7F7F7F; }))
        << "map only: LUT written";
  }
}

// A tiny Wan DiT of random weights (same seed on CPU f32 and CUDA bf16):
// head_dim 64 (the SLA kernels' smallest), latent 16 x 2 x 32 x 32 -> 512 tokens.
models::wan::WanConfig tiny_config() {
  models::wan::WanConfig c;
  c.variant = "tiny-sla";
  c.dim = 128, c.ffn_dim = 192, c.num_heads = 2, c.num_layers = 2, c.text_dim = 32, c.freq_dim = 32;
  return c;
}

Tensor dit_forward(Device device, bool with_proj_l, nn::AttentionKind kind, double topk, const Tensor& latent,
                   const Tensor& ts, const Tensor& ctx) {
  models::wan::RandomWanOptions ro;
  ro.device = device;
  ro.dtype = device.is_cuda() ? DType::BF16 : DType::F32;
  ro.with_proj_l = with_proj_l;
  ro.seed = 11;
  const models::wan::WanDiT m(models::wan::random_wan_checkpoint(tiny_config(), ro), kind, topk);
  return m.forward(latent, ts, ctx).to(Device::cpu());
}

TEST(SlaGpuWanDiT, CudaSlaForwardMatchesTheCpuSlaForward) {
  TD_REQUIRE_GPU();
  const Tensor latent = test::randn_tensor({1, 16, 2, 32, 32}, DType::F32);
  const Tensor ts = Tensor::from_f32({1}, {700.f});
  const Tensor ctx = test::randn_tensor({1, 7, 32}, DType::F32);
  using K = nn::AttentionKind;
  // topk 0.5: 4 of 8 key blocks; selection near-ties between the f32 and bf16
  // activations are rare at this margin.
  const Tensor cpu = dit_forward(Device::cpu(), true, K::SLA, 0.5, latent, ts, ctx);
  const Tensor gpu = dit_forward(Device::cuda(0), true, K::SLA, 0.5, latent, ts, ctx);
  const auto acc = test::compare(gpu, cpu);
  std::printf("DiT sla cuda vs cpu: %s\n", acc.str().c_str());
  TD_EXPECT_CLOSE(acc, 2e-2, 0.999);
  // Dense limit on CUDA: sla with topk 1 and proj_l 0 is original.
  const Tensor dense = dit_forward(Device::cuda(0), false, K::SLA, 1.0, latent, ts, ctx);
  const Tensor orig = dit_forward(Device::cuda(0), false, K::Original, 0.1, latent, ts, ctx);
  const auto acc2 = test::compare(dense, orig);
  std::printf("DiT sla topk 1 proj_l 0 vs original (cuda): %s\n", acc2.str().c_str());
  TD_EXPECT_CLOSE(acc2, 1e-2, 0.9999);
}

// The Staged K/V pass's two kernels: kv_partial_staged_kernel (the default:
// φ(K)ᵀV over a 4 x 2 grid of warps, two φ rows per lane group, the sage
// statistics from the mma fragments) against kv_partial_staged_row16_kernel
// (TD_SLA_KV_MMA=row16: warp w on feature rows 16w .. 16w + 15, as up to
// session 13), which feed every mma the same fragments in the same k order:
// the chunk partials (φ(K)ᵀV, Σφ(K); with the statistics Σ K and max |V|)
// byte for byte, compared as the whole linear workspace from identically
// poisoned buffers (a partial the default left unwritten keeps the poison),
// and the statistics folds' km / vscale / vinv. Fresh random K / V per case;
// lengths 1, 63, 65, 1000, 4133, 20000, 32760 (one token, a partial first
// tile, one row past a tile, partial last tiles and chunks), 1-3 heads, batch
// 1-2, D 128 and 64, every feature map, both layouts; without the statistics
// (sla_linear_prepare_cuda, then kv_project) and with them
// (sla_linear_prepare_stats_cuda with the projection deferred: the K/V pass
// and the statistics folds only).
TEST(SlaGpu, KvPartialPartitionsEqualBitForBit) {
  TD_REQUIRE_GPU();
  const char* prior = std::getenv("TD_SLA_KV_MMA");
  const std::string prior_value = prior ? prior : "";
  auto restore = [&] {
    if (prior) setenv("TD_SLA_KV_MMA", prior_value.c_str(), 1);
    else unsetenv("TD_SLA_KV_MMA");
  };
  struct C {
    int64_t B, L, H, D;
    SlaFeatureMap fm;
    bool bhld;
  };
  using F = SlaFeatureMap;
  const C cases[] = {C{1, 1, 1, 128, F::Softmax, false},     C{1, 63, 2, 128, F::Softmax, true},
                     C{1, 65, 3, 128, F::Softmax, false},    C{2, 1000, 2, 128, F::Elu, false},
                     C{1, 4133, 3, 128, F::Relu, true},      C{1, 32760, 3, 128, F::Softmax, false},
                     C{1, 20000, 2, 128, F::Softmax, true},  C{1, 1, 2, 64, F::Softmax, true},
                     C{1, 65, 1, 64, F::Elu, false},         C{2, 1000, 3, 64, F::Softmax, false},
                     C{1, 32760, 2, 64, F::Softmax, true},   C{1, 4133, 2, 64, F::Relu, false}};
  for (const C& c : cases) {
    SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D << " fm " << int(c.fm)
                                    << (c.bhld ? " bhld" : " blhd"));
    const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.bhld);
    SlaProblem pd = problem(in, in.qd, in.kd, in.vd, 0.1, 64, 128, c.fm);
    pd.linear_kernels = kernels::SlaLinearKernels::Staged;
    const Tensor w = test::randn_tensor({c.D, c.D}, DType::F32, 0.1f).to(Device::cuda(0));
    const Tensor bias = test::randn_tensor({c.D}, DType::F32, 0.1f).to(Device::cuda(0));
    const size_t ws_bytes = kernels::sla_linear_workspace_size(pd);
    const int64_t n = c.B * c.H * c.D;
    void* st = cuda::current_stream();
    for (const bool with_stats : {false, true}) {
      SCOPED_TRACE(with_stats ? "K/V pass with sage statistics" : "K/V pass");
      std::vector<std::vector<uint8_t>> wss, sts;
      for (const bool row16 : {true, false}) {
        Tensor ws = device_buffer({int64_t(ws_bytes)}, DType::U8);
        Tensor stt = device_buffer({3, n}, DType::F32);
        if (row16) setenv("TD_SLA_KV_MMA", "row16", 1);
        else unsetenv("TD_SLA_KV_MMA");
        Status s;
        if (with_stats) {
          kernels::SlaSageStats stats;
          stats.km = stt.data<float>();
          stats.vscale = stt.data<float>() + n;
          stats.vinv = stt.data<float>() + 2 * n;
          stats.defer_projection = true;
          s = kernels::sla_linear_prepare_stats_cuda(pd, in.kd.raw_data(), in.vd.raw_data(), w.raw_data(),
                                                     bias.raw_data(), kernels::ElemType::F32, stats, ws.raw_data(),
                                                     ws_bytes, st);
        } else {
          s = kernels::sla_linear_prepare_cuda(pd, in.kd.raw_data(), in.vd.raw_data(), w.raw_data(), bias.raw_data(),
                                               kernels::ElemType::F32, ws.raw_data(), ws_bytes, st);
        }
        restore();
        ASSERT_EQ(s, Status::Ok) << kernels::sla_last_error();
        wss.push_back(download<uint8_t>(ws));
        sts.push_back(download<uint8_t>(stt));
      }
      size_t first = 0;
      while (first < wss[0].size() && wss[0][first] == wss[1][first]) ++first;
      EXPECT_EQ(first, wss[0].size()) << "the linear workspace differs from byte " << first << " of " << ws_bytes;
      if (with_stats) {
        EXPECT_TRUE(sts[0] == sts[1]) << "the sage statistics differ";
      }
    }
  }
}

// The Staged apply's variants (TD_SLA_APPLY=staged128: linear_apply_staged_kernel;
// default: linear_apply_warp_copy_kernel, with TD_SLA_APPLY_PF=N prefetching N CTAs
// ahead, 0 none) write the same bits: onto identical copies of a random o (its
// padding, where the o stride has some, NaN-poisoned and left as it was) after
// one K/V half (sla_linear_prepare_stats_cuda), through sla_linear_apply_cuda and
// through the chained sla_linear_project_apply_cuda (whose o must also equal the
// plain path's, as in DeferredProjectionChainEqualsPrepareThenApply).
// Awkward lengths (1, 65, 1000, 4133, 32760: partial last tiles, prefetch targets
// across heads and batches and past the grid), 1-3 heads, batch 1-2, D 64 / 128,
// every feature map, Q in BLHD / BHLD, o in BLHD / BHLD with and without padding.
TEST(SlaGpu, LinearApplyVariantsEqualBitForBit) {
  TD_REQUIRE_GPU();
  const char* knobs[] = {"TD_SLA_APPLY", "TD_SLA_APPLY_PF"};
  std::vector<std::pair<bool, std::string>> prior;
  for (const char* k : knobs) {
    const char* v = std::getenv(k);
    prior.emplace_back(v != nullptr, v ? v : "");
  }
  auto restore = [&] {
    for (size_t i = 0; i < 2; ++i) {
      if (prior[i].first) setenv(knobs[i], prior[i].second.c_str(), 1);
      else unsetenv(knobs[i]);
    }
  };
  // {TD_SLA_APPLY, TD_SLA_APPLY_PF}; nullptr: unset. The first is the reference.
  const std::pair<const char*, const char*> variants[] = {
      {"staged128", nullptr}, {nullptr, nullptr}, {nullptr, "1"}, {nullptr, "7"}, {nullptr, "0"}};
  struct C {
    int64_t B, L, H, D;
    SlaFeatureMap fm;
    bool q_bhld, o_bhld;
    int64_t pad;  // extra channels per o row (a padded head stride)
  };
  using F = SlaFeatureMap;
  const C cases[] = {C{1, 1, 1, 128, F::Softmax, false, false, 0},  C{2, 65, 3, 64, F::Elu, true, false, 8},
                     C{1, 1000, 2, 128, F::Relu, true, true, 8},     C{2, 4133, 3, 128, F::Softmax, false, false, 16},
                     C{1, 32760, 2, 128, F::Softmax, false, false, 0}, C{1, 4133, 1, 64, F::Relu, false, true, 0},
                     C{1, 32760, 3, 64, F::Elu, true, false, 8},      C{2, 1000, 2, 64, F::Softmax, true, true, 0},
                     C{1, 65, 2, 128, F::Elu, false, true, 24},       C{2, 1, 3, 64, F::Softmax, false, false, 8}};
  for (const C& c : cases) {
    SCOPED_TRACE(testing::Message() << "B" << c.B << " L" << c.L << " H" << c.H << " D" << c.D << " fm " << int(c.fm)
                                    << (c.q_bhld ? " q bhld" : " q blhd") << (c.o_bhld ? " o bhld" : " o blhd")
                                    << " pad " << c.pad);
    const Inputs in = make_inputs(c.B, c.L, c.H, c.D, c.q_bhld);
    SlaProblem pd = problem(in, in.qd, in.kd, in.vd, 0.1, 64, 128, c.fm);
    pd.linear_kernels = kernels::SlaLinearKernels::Staged;
    const int64_t dp = c.D + c.pad;
    pd.o = c.o_bhld ? kernels::AttnStrides{c.H * c.L * dp, c.L * dp, dp}
                    : kernels::AttnStrides{c.L * c.H * dp, dp, c.H * dp};
    const Tensor w = test::randn_tensor({c.D, c.D}, DType::F32, 0.1f).to(Device::cuda(0));
    const Tensor bias = test::randn_tensor({c.D}, DType::F32, 0.1f).to(Device::cuda(0));
    // o: random, its padding channels (c >= D) NaN.
    Tensor o0h = test::randn_tensor({c.B * c.H * c.L, dp}, DType::BF16);
    std::vector<char> is_pad(size_t(o0h.numel()), 0);
    for (int64_t r = 0; r < c.B * c.H * c.L; ++r)
      for (int64_t ch = c.D; ch < dp; ++ch) {
        o0h.data<uint16_t>()[r * dp + ch] = 0x7fc0;
        is_pad[size_t(r * dp + ch)] = 1;
      }
    const std::vector<uint16_t> o0v(o0h.data<uint16_t>(), o0h.data<uint16_t>() + o0h.numel());
    const Tensor o0 = o0h.to(Device::cuda(0));
    const size_t ws_bytes = kernels::sla_linear_workspace_size(pd);
    void* st = cuda::current_stream();
    const int64_t n = c.B * c.H * c.D;
    std::vector<uint16_t> plain_ref;
    for (const bool chained : {false, true}) {
      SCOPED_TRACE(chained ? "sla_linear_project_apply_cuda" : "sla_linear_apply_cuda");
      // The K/V half as SageSLA runs it (with the sage statistics), the projection
      // deferred to the chained tail or not.
      Tensor ws = device_buffer({int64_t(ws_bytes)}, DType::U8);
      Tensor stt = device_buffer({3, n}, DType::F32);
      kernels::SlaSageStats stats;
      stats.km = stt.data<float>();
      stats.vscale = stt.data<float>() + n;
      stats.vinv = stt.data<float>() + 2 * n;
      stats.defer_projection = chained;
      ASSERT_EQ(kernels::sla_linear_prepare_stats_cuda(pd, in.kd.raw_data(), in.vd.raw_data(), w.raw_data(),
                                                       bias.raw_data(), kernels::ElemType::F32, stats, ws.raw_data(),
                                                       ws_bytes, st),
                Status::Ok)
          << kernels::sla_last_error();
      std::vector<std::vector<uint16_t>> outs;
      for (const auto& [apply, pf] : variants) {
        Tensor os = o0.clone();
        if (apply) setenv("TD_SLA_APPLY", apply, 1);
        else unsetenv("TD_SLA_APPLY");
        if (pf) setenv("TD_SLA_APPLY_PF", pf, 1);
        else unsetenv("TD_SLA_APPLY_PF");
        const Status s =
            chained ? kernels::sla_linear_project_apply_cuda(pd, in.qd.raw_data(), os.raw_data(), w.raw_data(),
                                                             bias.raw_data(), kernels::ElemType::F32, ws.raw_data(),
                                                             ws_bytes, st)
                    : kernels::sla_linear_apply_cuda(pd, in.qd.raw_data(), os.raw_data(), ws.raw_data(), ws_bytes, st);
        restore();
        ASSERT_EQ(s, Status::Ok) << kernels::sla_last_error();
        outs.push_back(download<uint16_t>(os));
      }
      size_t changed = 0, pad_kept = 0, pads = 0;
      for (size_t i = 0; i < o0v.size(); ++i) {
        if (is_pad[i]) {
          ++pads;
          pad_kept += outs[0][i] == o0v[i];
        } else {
          changed += outs[0][i] != o0v[i];
        }
      }
      EXPECT_EQ(pad_kept, pads) << "the apply wrote into o's padding";
      EXPECT_GT(changed, 0u) << "the apply left o as it was";
      for (size_t v = 1; v < outs.size(); ++v) {
        size_t first = 0;
        while (first < outs[0].size() && outs[0][first] == outs[v][first]) ++first;
        EXPECT_EQ(first, outs[0].size()) << "TD_SLA_APPLY=" << (variants[v].first ? variants[v].first : "(unset)")
                                         << " TD_SLA_APPLY_PF=" << (variants[v].second ? variants[v].second : "(unset)")
                                         << ": o differs from staged128's from element " << first;
      }
      if (chained) {
        EXPECT_TRUE(outs[0] == plain_ref) << "the chained apply differs from prepare + apply";
      } else {
        plain_ref = outs[0];
      }
    }
  }
}

}  // namespace
}  // namespace td
