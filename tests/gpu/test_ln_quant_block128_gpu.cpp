// The "stream" block128 kernel of the fused LayerNorm + AdaLN modulation +
// INT8 quantization (layernorm_modulate_quant_block128_stream.h) against the
// CPU reference layernorm_modulate_quant_block128_cpu, on fresh random inputs:
// every input type, awkward sizes (rows not a multiple of 128 or 32; dims 64,
// 128, 200, 1000, 1536, 4096, 5120), several samples per call (stripes that
// straddle two samples take the kernel's per-row modulation path), padded row
// strides, poisoned outputs and padding, every split of a stripe the chooser
// may pick (forced through the options), Wan's 32760 x 1536, determinism, and
// bad arguments.
//
// Bars: those of the other block128 paths (tests/gpu/test_quant_gpu.cpp): the
// kernel computes y in fp32 in another order (per-slab partial statistics
// merged with Chan's formula, y * inv folded into one fused multiply-add), so
// scales agree to 2e-5 relative, a code may move by +-1 near a rounding tie
// (at most 1e-3 of the codes, + 4), and the dequantized codes stay within half
// a step (a full step for the saturated 127) + 1e-5 (1 + |y|) of the
// reference's fp32 y.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/dtype.h"
#include "harness/harness.h"
#include "kernels/quant/layernorm_modulate_quant.h"
#include "kernels/quant/layernorm_modulate_quant_block128_stream.h"

#if TURBODIFF_HAVE_CUDA

namespace td::kernels {
namespace {

constexpr float kEps = 1e-6f;
constexpr uint8_t kCodePoison = 0x5a;
constexpr ElemType kTypes[] = {ElemType::F32, ElemType::F16, ElemType::BF16};

DType dtype_of(ElemType t) { return t == ElemType::F32 ? DType::F32 : t == ElemType::F16 ? DType::F16 : DType::BF16; }
const char* type_name(ElemType t) { return t == ElemType::F32 ? "f32" : t == ElemType::F16 ? "f16" : "bf16"; }
size_t elem_bytes(ElemType t) { return t == ElemType::F32 ? 4 : 2; }

struct DeviceBuf {
  void* base = nullptr;
  size_t bytes = 0;
  explicit DeviceBuf(size_t n) : bytes(n) { base = cuda::device_alloc(std::max<size_t>(n, 1), 0); }
  ~DeviceBuf() { cuda::device_free(base, 0); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  void* ptr() const { return base; }
  void upload(const void* host) { cuda::memcpy_sync(base, host, bytes, true); }
  void download(void* host) const { cuda::memcpy_sync(host, base, bytes, false); }
};

// x [rows, dim] with row stride dim + 8 (N(3, 2): a mean the statistics must
// remove), padding poisoned; Wan's e0 [samples, 6, dim] (shift = e0[:, 0],
// scale = e0[:, 1]).
struct Problem {
  ElemType type;
  int64_t rows, dim, ld, rows_per_batch, ld_mod;
  std::vector<unsigned char> x;
  std::vector<float> e0;
  const float* shift() const { return e0.data(); }
  const float* scale() const { return e0.data() + dim; }
};
Problem make_problem(ElemType t, int64_t rows, int64_t dim, int64_t rows_per_batch) {
  Problem p{t, rows, dim, dim + 8, rows_per_batch, 6 * dim, {}, {}};
  p.x.resize(size_t(rows * p.ld) * elem_bytes(t));
  test::poison(p.x.data(), p.x.size(), dtype_of(t));
  const std::vector<float> v = test::randn(size_t(rows * dim), 3.f, 2.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) store_from_f64(p.x.data(), dtype_of(t), size_t(r * p.ld + c), v[size_t(r * dim + c)]);
  p.e0 = test::randn(size_t((rows + rows_per_batch - 1) / rows_per_batch * p.ld_mod), 0.f, 0.4f);
  return p;
}

struct Output {
  std::vector<int8_t> q;
  std::vector<float> scales;
};

// Runs the stream kernel into poisoned buffers (q row stride dim + 16).
// Returns its status; *out holds the result when Ok.
Status run_stream(const Problem& p, LnQuantStreamOptions opt, Output* out) {
  const int64_t ld_q = p.dim + 16;
  const size_t nscales = size_t(quant_groups(p.rows) * quant_groups(p.dim));
  out->q.assign(size_t(p.rows * ld_q), 0);
  out->scales.assign(nscales, 0.f);
  test::poison(out->q.data(), out->q.size(), DType::I8);
  test::poison(out->scales.data(), nscales * 4, DType::F32);
  DeviceBuf x(p.x.size()), mod(p.e0.size() * 4), q(out->q.size()), s(nscales * 4);
  x.upload(p.x.data());
  mod.upload(p.e0.data());
  q.upload(out->q.data());
  s.upload(out->scales.data());
  const float* shift_d = static_cast<const float*>(mod.ptr());
  cuda::Stream stream(0);
  const Status st = layernorm_modulate_quant_block128_stream_cuda(
      p.type, x.ptr(), p.rows, p.dim, p.ld, shift_d, shift_d + p.dim, p.ld_mod, p.rows_per_batch, kEps,
      static_cast<int8_t*>(q.ptr()), ld_q, static_cast<float*>(s.ptr()), stream.native(), opt);
  if (st != Status::Ok) return st;
  stream.synchronize();
  q.download(out->q.data());
  s.download(out->scales.data());
  return Status::Ok;
}

// The kernel against the reference. Unsupported is accepted only where
// `may_refuse` (below sm_90, or a forced split this device cannot schedule).
void check(const Problem& p, const std::string& what, LnQuantStreamOptions opt = {}, bool may_refuse = false) {
  const auto info = cuda::device_info(0);
  const int64_t rows = p.rows, dim = p.dim, ld_q = dim + 16, groups = quant_groups(dim);
  std::vector<float> y(size_t(rows * dim));
  ASSERT_EQ(layernorm_modulate_f32_cpu(p.type, p.x.data(), rows, dim, p.ld, p.shift(), p.scale(), p.ld_mod,
                                       p.rows_per_batch, kEps, y.data(), dim),
            Status::Ok);
  Output ref{std::vector<int8_t>(size_t(rows * ld_q)), std::vector<float>(size_t(quant_groups(rows) * groups))};
  ASSERT_EQ(layernorm_modulate_quant_block128_cpu(p.type, p.x.data(), rows, dim, p.ld, p.shift(), p.scale(),
                                                  p.ld_mod, p.rows_per_batch, kEps, ref.q.data(), ld_q,
                                                  ref.scales.data()),
            Status::Ok);
  Output gpu;
  const Status st = run_stream(p, opt, &gpu);
  if (st == Status::Unsupported && (info.cc_major < 9 || may_refuse)) return;
  ASSERT_EQ(st, Status::Ok) << what;

  for (size_t i = 0; i < ref.scales.size(); ++i) {
    const float a = gpu.scales[i], b = ref.scales[i];
    ASSERT_TRUE(std::isfinite(a)) << what << " scale " << i << " not written";
    ASSERT_LE(std::fabs(a - b), 2e-5 * std::fabs(b)) << what << " scale " << i << ": gpu " << a << " cpu " << b;
  }
  size_t moved = 0, n = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < ld_q; ++c) {
      const int8_t a = gpu.q[size_t(r * ld_q + c)];
      if (c >= dim) {
        ASSERT_EQ(uint8_t(a), kCodePoison) << what << " q padding written at (" << r << ", " << c << ")";
        continue;
      }
      const int8_t b = ref.q[size_t(r * ld_q + c)];
      ++n;
      ASSERT_LE(std::abs(int(a) - int(b)), 1) << what << " code (" << r << ", " << c << "): gpu " << int(a)
                                              << " cpu " << int(b);
      moved += a != b;
      const float scale = gpu.scales[size_t((r / 128) * groups + c / 128)];
      const double yv = y[size_t(r * dim + c)], deq = double(a) * scale;
      const double step = a == 127 ? scale : 0.5 * scale;
      ASSERT_LE(std::fabs(deq - yv), step * (1 + 1e-5) + 1e-5 * (1 + std::fabs(yv)))
          << what << " dequantized (" << r << ", " << c << ")";
    }
  }
  EXPECT_LE(double(moved), 1e-3 * double(n) + 4) << what << ": " << moved << " of " << n << " codes moved by 1";
}

struct Case {
  int64_t rows, dim, rows_per_batch;
};
// Rows not multiples of 128 (or 32), one or several samples per call;
// rows_per_batch not a multiple of 128 puts two samples in one stripe.
constexpr Case kCases[] = {{300, 128, 300},  {1000, 1536, 1000}, {1000, 1536, 500}, {300, 4096, 150},
                           {1000, 5120, 500}, {130, 5120, 65},    {333, 1000, 111},  {129, 200, 43},
                           {37, 64, 37},      {1, 1536, 1},       {200, 1536, 100}};

std::string label(ElemType t, const Case& c) {
  return std::string("stream ") + type_name(t) + " " + std::to_string(c.rows) + "x" + std::to_string(c.dim) + " (" +
         std::to_string(c.rows_per_batch) + " rows/sample)";
}

TEST(LnQuantBlock128StreamGpu, MatchesReferenceOnAwkwardShapes) {
  TD_REQUIRE_GPU();
  for (ElemType t : kTypes)
    for (const Case& c : kCases) check(make_problem(t, c.rows, c.dim, c.rows_per_batch), label(t, c));
}

TEST(LnQuantBlock128StreamGpu, MatchesReferenceAtWan480p) {
  TD_REQUIRE_GPU();
  check(make_problem(ElemType::BF16, 32760, 1536, 32760), "stream bf16 32760x1536");
}

// Every split the chooser may pick, forced: 1 or 2 row parts x 1-16 column
// parts, powers of two (statistics merged by shuffles) and 3 / 6 (a lane per
// row); those that cannot be scheduled here say Unsupported.
TEST(LnQuantBlock128StreamGpu, EverySplitMatchesReference) {
  TD_REQUIRE_GPU();
  struct Forced {
    int64_t rows, dim, rows_per_batch;
    int row_parts, col_parts;
  };
  constexpr Forced kForced[] = {{1000, 1536, 1000, 1, 4}, {1000, 1536, 1000, 2, 2}, {1000, 1536, 700, 2, 4},
                                {700, 5120, 700, 1, 8},   {700, 5120, 300, 2, 8},   {500, 4096, 500, 2, 8},
                                {300, 1536, 300, 1, 2},   {257, 1000, 257, 2, 2},   {1000, 1536, 1000, 1, 3},
                                {300, 1536, 130, 2, 3},   {1000, 1536, 600, 1, 6}};
  for (ElemType t : {ElemType::BF16, ElemType::F32})
    for (const Forced& f : kForced) {
      const Problem p = make_problem(t, f.rows, f.dim, f.rows_per_batch);
      check(p,
            std::string("stream forced ") + std::to_string(f.row_parts) + "x" + std::to_string(f.col_parts) + " " +
                type_name(t) + " " + std::to_string(f.rows) + "x" + std::to_string(f.dim),
            LnQuantStreamOptions{f.row_parts, f.col_parts}, /*may_refuse=*/true);
    }
}

TEST(LnQuantBlock128StreamGpu, PlansForWanShapes) {
  TD_REQUIRE_GPU();
  if (cuda::device_info(0).cc_major < 9) GTEST_SKIP() << "the stream kernel needs sm_90";
  for (int64_t dim : {1536, 5120}) {
    LnQuantStreamPlan plan;
    ASSERT_EQ(layernorm_modulate_quant_block128_stream_plan(ElemType::BF16, dim, {}, &plan), Status::Ok) << dim;
    EXPECT_GE(plan.clusters, 1) << dim;
    EXPECT_EQ(plan.slab_cols % 128, 0) << dim;
    EXPECT_GE(plan.slab_cols * plan.col_parts, dim) << dim;
  }
}

TEST(LnQuantBlock128StreamGpu, Deterministic) {
  TD_REQUIRE_GPU();
  const Problem p = make_problem(ElemType::BF16, 1000, 5120, 400);
  Output a, b;
  const Status s1 = run_stream(p, {}, &a);
  if (s1 == Status::Unsupported && cuda::device_info(0).cc_major < 9) GTEST_SKIP() << "needs sm_90";
  ASSERT_EQ(s1, Status::Ok);
  ASSERT_EQ(run_stream(p, {}, &b), Status::Ok);
  EXPECT_EQ(std::memcmp(a.q.data(), b.q.data(), a.q.size()), 0);
  EXPECT_EQ(std::memcmp(a.scales.data(), b.scales.data(), a.scales.size() * 4), 0);
}

TEST(LnQuantBlock128StreamGpu, RejectsBadArguments) {
  TD_REQUIRE_GPU();
  cuda::Stream s(0);
  DeviceBuf x(1 << 20), mod(1 << 18), q(1 << 18), sc(1 << 12);
  const float* m = static_cast<const float*>(mod.ptr());
  auto* qp = static_cast<int8_t*>(q.ptr());
  auto* sp = static_cast<float*>(sc.ptr());
  auto run = [&](ElemType t, const void* xp, int64_t rows, int64_t dim, int64_t ld, int64_t ld_mod, int64_t rpb,
                 float eps, int8_t* qq, float* ss, LnQuantStreamOptions opt = {}) {
    return layernorm_modulate_quant_block128_stream_cuda(t, xp, rows, dim, ld, m, m, ld_mod, rpb, eps, qq, ld, ss,
                                                         s.native(), opt);
  };
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), 0, 1536, 1536, 1536, 1, kEps, qp, sp), Status::Ok);  // nothing to do
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), 4, 1001, 1008, 1008, 4, kEps, qp, sp), Status::InvalidArgument);  // dim % 8
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), 4, 1000, 1004, 1000, 4, kEps, qp, sp), Status::InvalidArgument);  // ld % 8
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), 4, 1000, 992, 1000, 4, kEps, qp, sp), Status::InvalidArgument);   // ld < dim
  EXPECT_EQ(run(ElemType::BF16, static_cast<char*>(x.ptr()) + 2, 4, 1000, 1000, 1000, 4, kEps, qp, sp),
            Status::InvalidArgument);  // misaligned x
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), 4, 40000, 40000, 40000, 4, kEps, qp, sp), Status::InvalidArgument);  // > 32768
  EXPECT_EQ(run(ElemType::I8, x.ptr(), 4, 64, 64, 64, 4, kEps, qp, sp), Status::InvalidArgument);  // type
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), 4, 64, 64, 64, 0, kEps, qp, sp), Status::InvalidArgument);  // rows_per_batch
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), 4, 64, 64, 64, 4, std::nanf(""), qp, sp), Status::InvalidArgument);  // eps
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), 4, 64, 64, 64, 4, kEps, nullptr, sp), Status::InvalidArgument);  // no q
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), 4, 64, 64, 64, 4, kEps, qp, nullptr), Status::InvalidArgument);  // no scales
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), -1, 64, 64, 64, 4, kEps, qp, sp), Status::InvalidArgument);  // rows < 0
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), 4, 64, 64, 64, 4, kEps, qp, sp, LnQuantStreamOptions{-1, 0}),
            Status::InvalidArgument);  // negative split
  // A split no chooser accepts (3 row parts) or a slab wider than the ring
  // (fp32 rows of 32768 columns in a single CTA): Unsupported, the caller falls back.
  EXPECT_EQ(run(ElemType::BF16, x.ptr(), 4, 1536, 1536, 1536, 4, kEps, qp, sp, LnQuantStreamOptions{3, 4}),
            Status::Unsupported);
  EXPECT_EQ(run(ElemType::F32, x.ptr(), 4, 32768, 32768, 32768, 4, kEps, qp, sp, LnQuantStreamOptions{1, 1}),
            Status::Unsupported);
  s.synchronize();
}

}  // namespace
}  // namespace td::kernels

#endif  // TURBODIFF_HAVE_CUDA
