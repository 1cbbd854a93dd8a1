// SageAttention-style quantized attention on the GPU (sage_attention_cuda),
// every backend the device runs (portable mma.sync; sm_90a when built and on a
// Hopper GPU), on fresh random BF16 inputs with NaN-poisoned O and LSE:
//   - against sage_attention_cpu, the fp32 simulation of the same quantization
//     (tight: differences are ex2.approx, fp32 sum order, the BF16 output);
//   - against exact attention (attention_cpu: fp32 with fp64 row sums) with
//     issue 5's bars, cosine >= 0.999 and relative L1 <= 4e-2, on Gaussian and
//     DiT-like structured inputs; the LSE against the exact LSE;
//   - the sparse mode against SLA's exact sparse branch (sla_sparse_cpu) with
//     the same random LUT, 128x64 and 64x128 blocks;
//   - both layouts, head_dim 64 and 128, lengths that are not multiples of the
//     blocks, Lq != Lk (cross attention Lk = 512), padded output strides;
//   - one 1x2x32760x128 problem against an fp64 reference on a subset of rows.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/dtype.h"
#include "harness/harness.h"
#include "kernels/attention/attention.h"
#include "kernels/sage_attention/sage_attention.h"
#include "kernels/sla/sla.h"
#include "ops/sage_attention.h"

namespace td {
namespace {

using kernels::AttnLayout;
using kernels::AttnProblem;
using kernels::AttnStrides;
using kernels::ElemType;
using kernels::SageBackend;
using kernels::SageSparse;
using kernels::Status;

// Against exact attention (issue 5).
constexpr double kMinCosine = 0.999;
constexpr double kMaxRelL1 = 4e-2;
constexpr double kMaxLseAbs = 5e-2;
// The structured inputs' 8x channels in Q and K make logits of ~20: the INT8
// step of the other channels (per-token Q, per-64-key K) moves the row maximum,
// hence the LSE, by up to ~0.6 (the CPU simulation shows the same; the outputs
// still meet the bars above).
constexpr double kMaxLseAbsStructured = 1.0;
// Against the simulation of the same quantization.
constexpr double kSimMaxRelL2 = 5e-3;
constexpr double kSimMinCosine = 0.99995;
constexpr double kSimMaxLseAbs = 2e-3;
constexpr uint16_t kBf16NaN = 0x7fc0;

int64_t offset(const AttnStrides& s, int64_t b, int64_t h, int64_t t) { return b * s.batch + h * s.head + t * s.token; }

struct DeviceBuf {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuf(size_t n) : bytes(n) { ptr = n ? cuda::device_alloc(n, 0) : nullptr; }
  ~DeviceBuf() {
    if (ptr) cuda::device_free(ptr, 0);
  }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  template <typename T>
  void upload(const std::vector<T>& host) {
    cuda::memcpy_sync(ptr, host.data(), host.size() * sizeof(T), true);
  }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> host(bytes / sizeof(T));
    cuda::memcpy_sync(host.data(), ptr, bytes, false);
    return host;
  }
};

struct Case {
  const char* name;
  AttnLayout layout;
  int64_t batch, heads, len_q, len_kv, head_dim;
  bool structured;
  bool padded_o;
  int64_t block_q = 0, block_k = 0, n_sel = 0;  // sparse when n_sel > 0
};

std::string case_str(const Case& c) {
  std::string s = std::string(c.layout == AttnLayout::BLHD ? "BLHD" : "BHLD") + " B=" + std::to_string(c.batch) +
                  " H=" + std::to_string(c.heads) + " Lq=" + std::to_string(c.len_q) + " Lk=" + std::to_string(c.len_kv) +
                  " D=" + std::to_string(c.head_dim) + (c.structured ? " structured" : "") + (c.padded_o ? " padded-o" : "");
  if (c.n_sel) s += " sparse " + std::to_string(c.block_q) + "x" + std::to_string(c.block_k) + " n_sel " + std::to_string(c.n_sel);
  return s;
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_str(c); }

// Inputs (bf16-rounded fp32 on the host, bf16 on the device) in the case's layout.
struct Fixture {
  AttnProblem p;    // bf16, the case's layout and O strides
  AttnProblem pf;   // the same problem as fp32 in and out, O logical [B, H, Lq, D]
  std::vector<float> q, k, v;
  std::unique_ptr<DeviceBuf> qd, kd, vd;
  std::vector<int32_t> lut;
  size_t o_elems = 0;
};

std::vector<float> bf16_round(std::vector<float> x) {
  for (float& e : x) e = bf16_to_f32(f32_to_bf16(e));
  return x;
}
std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}

std::unique_ptr<Fixture> make_fixture(const Case& c) {
  auto f = std::make_unique<Fixture>();
  const int64_t B = c.batch, H = c.heads, D = c.head_dim;
  f->p = AttnProblem::make(c.layout, B, H, c.len_q, c.len_kv, D, ElemType::BF16);
  if (c.padded_o) {
    if (c.layout == AttnLayout::BLHD) f->p.o = {c.len_q * (H * D + 8), D, H * D + 8};
    else f->p.o = {H * c.len_q * (D + 8), c.len_q * (D + 8), D + 8};
  }
  f->pf = f->p;
  f->pf.qkv_type = f->pf.o_type = ElemType::F32;
  f->pf.o = kernels::attn_contiguous_strides(AttnLayout::BHLD, H, c.len_q, D);
  f->q = test::randn(size_t(B * H * c.len_q * D));
  f->k = test::randn(size_t(B * H * c.len_kv * D));
  f->v = test::randn(size_t(B * H * c.len_kv * D));
  if (c.structured) {
    const AttnProblem& p = f->p;
    const int64_t big[] = {5, D / 2 + 1, D - 3};
    const std::vector<float> shift = test::randn(size_t(H * D), 0.f, 2.f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t t = 0; t < c.len_q; ++t)
          for (int64_t ch : big) f->q[size_t(offset(p.q, b, h, t) + ch)] *= 8.f;
        for (int64_t t = 0; t < c.len_kv; ++t) {
          for (int64_t ch : big) f->k[size_t(offset(p.k, b, h, t) + ch)] *= 8.f;
          for (int64_t ch = 0; ch < D; ++ch) {
            f->k[size_t(offset(p.k, b, h, t) + ch)] += shift[size_t(h * D + ch)];
            f->v[size_t(offset(p.v, b, h, t) + ch)] += 0.5f;
          }
        }
      }
  }
  f->q = bf16_round(f->q);
  f->k = bf16_round(f->k);
  f->v = bf16_round(f->v);
  for (auto [host, dev] : {std::pair{&f->q, &f->qd}, std::pair{&f->k, &f->kd}, std::pair{&f->v, &f->vd}}) {
    *dev = std::make_unique<DeviceBuf>(host->size() * 2);
    (*dev)->upload(to_bf16(*host));
  }
  f->o_elems = size_t(offset(f->p.o, B - 1, H - 1, c.len_q - 1) + D);
  if (c.n_sel) {
    const int64_t QB = (c.len_q + c.block_q - 1) / c.block_q, KB = (c.len_kv + c.block_k - 1) / c.block_k;
    std::vector<int32_t> all(static_cast<size_t>(KB));
    for (int64_t r = 0; r < B * H * QB; ++r) {
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), test::rng());
      f->lut.insert(f->lut.end(), all.begin(), all.begin() + c.n_sel);
    }
  }
  return f;
}

struct GpuOut {
  std::vector<double> o;  // logical [B, H, Lq, D]
  std::vector<float> lse;
  size_t padding_touched = 0;
  Status status = Status::Ok;
};

GpuOut run_gpu(const Fixture& f, const Case& c, SageBackend be, bool with_lse = true) {
  GpuOut out;
  const AttnProblem& p = f.p;
  DeviceBuf o(f.o_elems * 2), lse(size_t(kernels::attention_lse_count(p)) * 4);
  o.upload(std::vector<uint16_t>(f.o_elems, kBf16NaN));
  lse.upload(std::vector<float>(size_t(kernels::attention_lse_count(p)), NAN));
  std::unique_ptr<DeviceBuf> lut;
  SageSparse sp;
  if (c.n_sel) {
    lut = std::make_unique<DeviceBuf>(f.lut.size() * 4);
    lut->upload(f.lut);
    sp = SageSparse{static_cast<const int32_t*>(lut->ptr), c.n_sel, c.block_q, c.block_k};
  }
  out.status = kernels::sage_attention_supports(p, c.n_sel ? &sp : nullptr, be);
  if (out.status != Status::Ok) return out;
  const size_t ws_bytes = kernels::sage_attention_workspace_size(p, be);
  DeviceBuf ws(ws_bytes);
  cuda::Stream stream(0);
  out.status = kernels::sage_attention_cuda(p, f.qd->ptr, f.kd->ptr, f.vd->ptr, o.ptr,
                                            with_lse ? static_cast<float*>(lse.ptr) : nullptr,
                                            c.n_sel ? &sp : nullptr, be, ws.ptr, ws_bytes, stream.native());
  if (out.status != Status::Ok) return out;
  stream.synchronize();
  cuda::check_last_launch("sage_attention");
  const std::vector<uint16_t> oh = o.download<uint16_t>();
  std::vector<char> is_o(oh.size(), 0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.len_q; ++i)
        for (int64_t ch = 0; ch < p.head_dim; ++ch) {
          const size_t idx = size_t(offset(p.o, b, h, i) + ch);
          out.o.push_back(bf16_to_f32(oh[idx]));
          is_o[idx] = 1;
        }
  for (size_t i = 0; i < oh.size(); ++i)
    if (!is_o[i] && oh[i] != kBf16NaN) ++out.padding_touched;
  out.lse = lse.download<float>();
  return out;
}

std::pair<double, size_t> lse_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double m = 0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) ++bad;
    else m = std::max(m, std::abs(double(got[i]) - double(ref[i])));
  }
  return {m, bad};
}

// The backends this device runs: the portable kernel always, sm_90a where it is built and the GPU is Hopper.
std::vector<SageBackend> device_backends() {
  std::vector<SageBackend> out = {SageBackend::Portable};
  AttnProblem p = AttnProblem::make(AttnLayout::BLHD, 1, 1, 128, 128, 128);
  if (kernels::sage_attention_supports(p, nullptr, SageBackend::Sm90) == Status::Ok) out.push_back(SageBackend::Sm90);
  return out;
}
const char* be_name(SageBackend be) { return be == SageBackend::Sm90 ? "sm90" : "portable"; }

class SageAttentionGpu : public ::testing::TestWithParam<Case> {};

TEST_P(SageAttentionGpu, MatchesSimulationAndExact) {
  TD_REQUIRE_GPU();
  const Case& c = GetParam();
  SCOPED_TRACE(case_str(c));
  const auto f = make_fixture(c);
  const int64_t nlse = kernels::attention_lse_count(f->p);

  // Exact reference: dense attention_cpu, or SLA's exact sparse branch with the same LUT.
  std::vector<float> exact_o(size_t(c.batch * c.heads * c.len_q * c.head_dim)), exact_lse(static_cast<size_t>(nlse));
  if (!c.n_sel) {
    ASSERT_EQ(kernels::attention_cpu(f->pf, f->q.data(), f->k.data(), f->v.data(), exact_o.data(), exact_lse.data()),
              Status::Ok)
        << kernels::attention_last_error();
  } else {
    kernels::SlaProblem sp;
    sp.batch = c.batch;
    sp.heads = c.heads;
    sp.len = c.len_q;
    sp.head_dim = c.head_dim;
    sp.q = f->pf.q;
    sp.k = f->pf.k;
    sp.v = f->pf.v;
    sp.o = f->pf.o;
    sp.scale = f->pf.scale;
    sp.block_q = c.block_q;
    sp.block_k = c.block_k;
    ASSERT_EQ(kernels::sla_sparse_cpu(sp, f->q.data(), f->k.data(), f->v.data(), f->lut.data(), c.n_sel,
                                      exact_o.data(), exact_lse.data()),
              Status::Ok)
        << kernels::sla_last_error();
  }
  const std::vector<double> exact(exact_o.begin(), exact_o.end());

  for (const SageBackend be : device_backends()) {
    SCOPED_TRACE(be_name(be));
    const GpuOut g = run_gpu(*f, c, be);
    if (be == SageBackend::Sm90 && c.n_sel && !(c.block_q == 64 && c.block_k == 128)) {
      // The sm_90a kernel serves SageSLA's 64x128 blocks only; others go to the portable kernel.
      EXPECT_EQ(g.status, Status::Unsupported);
      EXPECT_NE(std::string(kernels::attention_last_error()).find("64x128"), std::string::npos)
          << kernels::attention_last_error();
      continue;
    }
    ASSERT_EQ(g.status, Status::Ok) << kernels::attention_last_error();
    EXPECT_EQ(g.padding_touched, 0u) << "elements outside O were written";

    std::vector<float> sim_o(exact_o.size()), sim_lse(static_cast<size_t>(nlse));
    const SageSparse hsp{f->lut.data(), c.n_sel, c.block_q, c.block_k};
    ASSERT_EQ(kernels::sage_attention_cpu(f->pf, f->q.data(), f->k.data(), f->v.data(), sim_o.data(), sim_lse.data(),
                                          c.n_sel ? &hsp : nullptr, be),
              Status::Ok)
        << kernels::attention_last_error();
    const test::Accuracy vs_sim = test::compare(g.o, std::vector<double>(sim_o.begin(), sim_o.end()));
    TD_EXPECT_CLOSE(vs_sim, kSimMaxRelL2, kSimMinCosine);
    const auto [sim_lse_err, sim_lse_bad] = lse_err(g.lse, sim_lse);
    EXPECT_EQ(sim_lse_bad, 0u) << "LSE entries left NaN";
    EXPECT_LE(sim_lse_err, kSimMaxLseAbs);

    const test::Accuracy vs_exact = test::compare(g.o, exact);
    EXPECT_GE(vs_exact.cosine, kMinCosine) << vs_exact.str();
    EXPECT_LE(vs_exact.rel_l1, kMaxRelL1) << vs_exact.str();
    EXPECT_LE(lse_err(g.lse, exact_lse).first, c.structured ? kMaxLseAbsStructured : kMaxLseAbs);
    std::printf("[ sage %s ] %s: vs simulation %s | vs exact %s | LSE max abs err %.3g\n", be_name(be),
                case_str(c).c_str(), vs_sim.str().c_str(), vs_exact.str().c_str(), lse_err(g.lse, exact_lse).first);

    if (!c.n_sel) continue;
    // Sparse without an LSE (SageSLA's call): on sm_90a the row sums come from
    // the tensor cores over the rounded P̃, which the simulation models when
    // it is asked for no LSE either.
    const GpuOut gn = run_gpu(*f, c, be, /*with_lse=*/false);
    ASSERT_EQ(gn.status, Status::Ok) << kernels::attention_last_error();
    EXPECT_EQ(gn.padding_touched, 0u) << "elements outside O were written (no LSE)";
    std::vector<float> sim_n(exact_o.size());
    ASSERT_EQ(kernels::sage_attention_cpu(f->pf, f->q.data(), f->k.data(), f->v.data(), sim_n.data(), nullptr, &hsp, be),
              Status::Ok)
        << kernels::attention_last_error();
    const test::Accuracy n_sim = test::compare(gn.o, std::vector<double>(sim_n.begin(), sim_n.end()));
    TD_EXPECT_CLOSE(n_sim, kSimMaxRelL2, kSimMinCosine);
    const test::Accuracy n_exact = test::compare(gn.o, exact);
    EXPECT_GE(n_exact.cosine, kMinCosine) << n_exact.str();
    EXPECT_LE(n_exact.rel_l1, kMaxRelL1) << n_exact.str();
    std::printf("[ sage %s, no LSE ] %s: vs simulation %s | vs exact %s\n", be_name(be), case_str(c).c_str(),
                n_sim.str().c_str(), n_exact.str().c_str());
  }
}

// clang-format off
const Case kCases[] = {
  // name                 layout           B  H  Lq    Lk    D    struct  pad_o  bq   bk   n_sel
  {"self_300_d128",       AttnLayout::BLHD, 1, 2, 300,  300,  128, false, false},
  {"cross_77x512_d128",   AttnLayout::BLHD, 1, 2, 77,   512,  128, false, false},
  {"q1000_k333_d64_bhld", AttnLayout::BHLD, 2, 3, 1000, 333,  64,  false, false},
  {"q1_k1_d128",          AttnLayout::BHLD, 1, 2, 1,    1,    128, false, false},
  {"ragged_129x65_d64",   AttnLayout::BLHD, 1, 3, 129,  65,   64,  false, true},
  {"structured_1000_d128",AttnLayout::BHLD, 1, 2, 1000, 1000, 128, true,  false},
  {"structured_513x77_d64",AttnLayout::BLHD,1, 2, 513,  77,   64,  true,  true},
  {"cross_1537x512_d128", AttnLayout::BHLD, 1, 2, 1537, 512,  128, true,  false},
  {"sparse_128x64_1000",  AttnLayout::BLHD, 1, 2, 1000, 1000, 128, false, false, 128, 64,  3},
  {"sparse_64x128_1000",  AttnLayout::BLHD, 1, 2, 1000, 1000, 128, false, false, 64,  128, 2},
  {"sparse_64x128_d64_bhld",AttnLayout::BHLD,2,2, 777,  777,  64,  true,  false, 64,  128, 3},
  {"sparse_128x128_333",  AttnLayout::BLHD, 1, 2, 333,  333,  128, false, true,  128, 128, 2},
  {"sparse_64x64_all",    AttnLayout::BLHD, 1, 1, 200,  200,  64,  false, false, 64,  64,  4},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(Cases, SageAttentionGpu, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(SageAttentionGpuLarge, Wan480pLengthAgainstFp64OnRowSubset) {
  // 1 x 2 x 32760 x 128 Gaussian (the accuracy length), every backend;
  // fp64 exact attention for 96 query rows per head spread over the sequence.
  TD_REQUIRE_GPU();
  const Case c{"l32760", AttnLayout::BLHD, 1, 2, 32760, 32760, 128, false, false};
  const auto f = make_fixture(c);
  const AttnProblem& p = f->p;
  const int64_t L = c.len_q, D = c.head_dim;
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < 96; ++i) rows.push_back(std::min(L - 1, i * 341 + (i % 7)));
  std::vector<double> ref, ref_lse;
  std::vector<double> s(static_cast<size_t>(L));
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t i : rows) {
      double mx = -INFINITY;
      for (int64_t t = 0; t < L; ++t) {
        double d = 0;
        for (int64_t ch = 0; ch < D; ++ch)
          d += double(f->q[size_t(offset(p.q, 0, h, i) + ch)]) * double(f->k[size_t(offset(p.k, 0, h, t) + ch)]);
        s[size_t(t)] = d * double(p.scale);
        mx = std::max(mx, s[size_t(t)]);
      }
      double l = 0;
      std::vector<double> acc(static_cast<size_t>(D), 0.0);
      for (int64_t t = 0; t < L; ++t) {
        const double w = std::exp(s[size_t(t)] - mx);
        l += w;
        for (int64_t ch = 0; ch < D; ++ch) acc[size_t(ch)] += w * double(f->v[size_t(offset(p.v, 0, h, t) + ch)]);
      }
      for (int64_t ch = 0; ch < D; ++ch) ref.push_back(acc[size_t(ch)] / l);
      ref_lse.push_back(mx + std::log(l));
    }
  for (const SageBackend be : device_backends()) {
    SCOPED_TRACE(be_name(be));
    const GpuOut g = run_gpu(*f, c, be);
    ASSERT_EQ(g.status, Status::Ok) << kernels::attention_last_error();
    std::vector<double> got;
    double lse_max = 0;
    size_t r = 0;
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i : rows) {
        for (int64_t ch = 0; ch < D; ++ch) got.push_back(g.o[size_t((h * L + i) * D + ch)]);
        lse_max = std::max(lse_max, std::abs(double(g.lse[size_t(h * L + i)]) - ref_lse[r++]));
      }
    const test::Accuracy a = test::compare(got, ref);
    EXPECT_EQ(a.nonfinite, 0u) << a.str();
    EXPECT_GE(a.cosine, kMinCosine) << a.str();
    EXPECT_LE(a.rel_l1, kMaxRelL1) << a.str();
    EXPECT_LE(lse_max, kMaxLseAbs);
    std::printf("[ sage %s ] 1x2x32760x128 Gaussian vs fp64 (%zu rows): %s, LSE max abs err %.3g\n", be_name(be),
                rows.size() * size_t(c.heads), a.str().c_str(), lse_max);
  }
}

TEST(SageAttentionGpuSparse, OutOfRangeLutEntriesAreSkipped) {
  // The sm_90a sparse kernels skip a LUT entry outside [0, KB) (no keys; the
  // lean variants route it through the partial-tile path as a tile with no
  // valid key). Every LUT row here holds one such entry (-1, KB or KB + 5) at a
  // rotating position, the first position included (a row whose running max
  // is still -inf), beside 2 valid ones: the result must be the CPU
  // simulation of the row without it. 777 tokens: a partial last key block
  // and an odd number of query blocks.
  TD_REQUIRE_GPU();
  const Case c3{"sparse_oob_777", AttnLayout::BLHD, 1, 2, 777, 777, 128, false, false, 64, 128, 3};
  Case c2 = c3;
  c2.n_sel = 2;
  const auto f = make_fixture(c2);
  const std::vector<int32_t> lut2 = f->lut;
  const int32_t KB = int32_t((c3.len_kv + c3.block_k - 1) / c3.block_k);
  const int32_t bad[] = {-1, KB, KB + 5};
  std::vector<int32_t> lut3;
  for (size_t r = 0; r < lut2.size() / 2; ++r) {
    const size_t at = r % 3;  // position of the out-of-range entry in the row
    for (size_t i = 0, v = 0; i < 3; ++i) lut3.push_back(i == at ? bad[(r / 3) % 3] : lut2[2 * r + v++]);
  }
  f->lut = lut3;

  const SageSparse hsp{lut2.data(), 2, c3.block_q, c3.block_k};
  std::vector<float> sim_o(size_t(c3.batch * c3.heads * c3.len_q * c3.head_dim)),
      sim_lse(static_cast<size_t>(kernels::attention_lse_count(f->pf)));
  ASSERT_EQ(kernels::sage_attention_cpu(f->pf, f->q.data(), f->k.data(), f->v.data(), sim_o.data(), sim_lse.data(), &hsp,
                                        SageBackend::Sm90),
            Status::Ok)
      << kernels::attention_last_error();
  const std::vector<double> sim(sim_o.begin(), sim_o.end());
  int runs = 0;
  for (const SageBackend be : device_backends()) {
    if (be != SageBackend::Sm90) continue;
    const GpuOut g = run_gpu(*f, c3, be);
    ASSERT_EQ(g.status, Status::Ok) << kernels::attention_last_error();
    EXPECT_EQ(g.padding_touched, 0u);
    const test::Accuracy vs_sim = test::compare(g.o, sim);
    EXPECT_EQ(vs_sim.nonfinite, 0u) << vs_sim.str();
    TD_EXPECT_CLOSE(vs_sim, kSimMaxRelL2, kSimMinCosine);
    const auto [lse_abs, lse_bad] = lse_err(g.lse, sim_lse);
    EXPECT_EQ(lse_bad, 0u) << "LSE entries not finite";
    EXPECT_LE(lse_abs, 2 * kSimMaxLseAbs);
    std::printf("[ sage %s ] %s with out-of-range LUT entries: vs simulation %s | LSE max abs err %.3g\n",
                be_name(be), case_str(c3).c_str(), vs_sim.str().c_str(), lse_abs);
    ++runs;
  }
  if (runs == 0) GTEST_SKIP() << "no sm_90a backend on this device/build";
}

TEST(SageAttentionGpuOps, CudaTensorsMatchTheCpuSimulation) {
  // ops::sage_attention on CUDA tensors (Auto: sm_90a on Hopper when built,
  // else portable), dense and 64x128-sparse, against the same op on host tensors.
  TD_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const int64_t B = 1, L = 300, H = 2, D = 128;
  const Tensor q = test::randn_tensor({B, L, H, D}, DType::BF16), k = test::randn_tensor({B, L, H, D}, DType::BF16),
               v = test::randn_tensor({B, L, H, D}, DType::BF16);
  const Tensor qg = q.to(gpu), kg = k.to(gpu), vg = v.to(gpu);
  const SageBackend expected = device_backends().back();
  const std::string expected_name = expected == SageBackend::Sm90 ? "sm90" : "portable";
  Tensor lut = Tensor::empty({B, H, (L + 63) / 64, 2}, DType::I32);
  for (int64_t i = 0; i < lut.numel(); ++i) lut.data<int32_t>()[i] = int32_t((i * 7 + i / 2) % 3);
  for (int64_t i = 0; i < lut.numel(); i += 2)
    if (lut.data<int32_t>()[i] == lut.data<int32_t>()[i + 1]) lut.data<int32_t>()[i + 1] = (lut.data<int32_t>()[i] + 1) % 3;
  for (const bool sparse : {false, true}) {
    SCOPED_TRACE(sparse ? "sparse" : "dense");
    ops::SageAttentionOptions go, co;
    co.backend = expected;  // the CPU simulation of the backend Auto picks
    if (sparse) {
      go.lut = lut.to(gpu);
      co.lut = lut;
    }
    Tensor lse_g, lse_c;
    const Tensor og = ops::sage_attention(qg, kg, vg, go, {}, &lse_g);
    EXPECT_EQ(ops::sage_attention_last_backend(), expected_name);
    const Tensor oc = ops::sage_attention(q, k, v, co, DType::F32, &lse_c);
    EXPECT_EQ(ops::sage_attention_last_backend(), "cpu");
    TD_EXPECT_CLOSE(test::compare(og, oc), kSimMaxRelL2, kSimMinCosine);
    const test::Accuracy la = test::compare(lse_g, lse_c);
    EXPECT_LE(la.max_abs, kSimMaxLseAbs) << la.str();
  }
}

TEST(SageAttentionGpuArgs, UnsupportedProblemsSayWhy) {
  TD_REQUIRE_GPU();
  AttnProblem p = AttnProblem::make(AttnLayout::BLHD, 1, 2, 64, 64, 96);
  EXPECT_EQ(kernels::sage_attention_supports(p, nullptr, SageBackend::Portable), Status::Unsupported);
  EXPECT_NE(std::string(kernels::attention_last_error()).find("head_dim must be 64 or 128"), std::string::npos)
      << kernels::attention_last_error();
  p = AttnProblem::make(AttnLayout::BLHD, 1, 2, 64, 64, 128);
  p.o_type = ElemType::F32;
  EXPECT_EQ(kernels::sage_attention_supports(p, nullptr, SageBackend::Portable), Status::Unsupported);
  p = AttnProblem::make(AttnLayout::BLHD, 1, 2, 64, 64, 128);
  const int32_t* fake = reinterpret_cast<const int32_t*>(16);
  SageSparse sp{fake, 1, 96, 64};
  EXPECT_EQ(kernels::sage_attention_supports(p, &sp, SageBackend::Portable), Status::InvalidArgument);
  // Too small a workspace is refused before any launch.
  DeviceBuf buf(1 << 20);
  auto* base = static_cast<uint8_t*>(buf.ptr);
  EXPECT_EQ(kernels::sage_attention_cuda(p, base, base, base, base + (1 << 19), nullptr, nullptr, SageBackend::Portable,
                                         base, 64, nullptr),
            Status::InvalidArgument);
  EXPECT_NE(std::string(kernels::attention_last_error()).find("workspace"), std::string::npos)
      << kernels::attention_last_error();
}

}  // namespace
}  // namespace td
