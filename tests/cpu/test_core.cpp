#include <cmath>
#include <limits>
#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "harness/harness.h"

namespace td {
namespace {

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values: ties to even -> 1.0
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3*2^-8 rounds up to 1 + 2^-6... (ties to even: 0x3f82)
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  for (float x : test::randn(1000, 0, 100)) {
    float y = bf16_to_f32(f32_to_bf16(x));
    EXPECT_LE(std::fabs(y - x), std::fabs(x) * (1.0f / 256)) << x;
  }
}

TEST(DType, F16AllValuesRoundTrip) {
  // every finite f16 survives f16 -> f32 -> f16 exactly
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t v = uint16_t(h);
    if (((v >> 10) & 0x1f) == 0x1f) continue;  // inf/nan
    ASSERT_EQ(f32_to_f16(f16_to_f32(v)), v) << std::hex << h;
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
}

TEST(DType, F8E4M3AllValuesRoundTripAndSaturate) {
  for (uint32_t c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f8e4m3_to_f32(uint8_t(c))));
      continue;
    }
    ASSERT_EQ(f32_to_f8e4m3(f8e4m3_to_f32(uint8_t(c))), uint8_t(c)) << c;
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_f8e4m3(1000.0f, true), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-1000.0f, true), 0xfe);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(f32_to_f8e4m3(1000.0f, false))));
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  // round to nearest even: 1 + 1/16 is halfway between 1 and 1.125
  EXPECT_EQ(f8e4m3_to_f32(f32_to_f8e4m3(1.0f + 1.0f / 16)), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(f32_to_f8e4m3(1.0f + 3.0f / 16)), 1.25f);
}

TEST(DType, F8E5M2RoundTrip) {
  for (uint32_t c = 0; c < 256; ++c) {
    float f = f8e5m2_to_f32(uint8_t(c));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f8e5m2(f), uint8_t(c)) << c;
  }
}

TEST(DType, NamesRoundTrip) {
  for (DType t : kAllDTypes) {
    EXPECT_EQ(dtype_from_safetensors_name(dtype_safetensors_name(t)), t);
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  EXPECT_FALSE(dtype_from_safetensors_name("F128").has_value());
}

TEST(DType, IntegerStoreSaturates) {
  int8_t v[3];
  store_from_f64(v, DType::I8, 0, 300.0);
  store_from_f64(v, DType::I8, 1, -300.0);
  store_from_f64(v, DType::I8, 2, 2.5);  // ties to even
  EXPECT_EQ(v[0], 127);
  EXPECT_EQ(v[1], -128);
  EXPECT_EQ(v[2], 2);
}

TEST(Tensor, ViewsShareStorageAndCheckBounds) {
  Tensor t = Tensor::from_f32({2, 3, 4}, test::randn(24));
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_FALSE(p.is_contiguous());
  Tensor c = p.contiguous();
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t d = 0; d < 3; ++d)
        EXPECT_EQ(c.item_f64((a * 2 + b) * 3 + d), t.item_f64((b * 3 + d) * 4 + a));
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(s.item_f64(0), t.item_f64(4));
  EXPECT_EQ(t.view({6, -1}).shape(), (Shape{6, 4}));
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(p.view({24}), Error);
  EXPECT_THROW(t.slice(0, 1, 3), Error);
  EXPECT_THROW(Tensor(t.storage(), DType::F32, {25}, {1}), Error);  // past the storage
  Tensor sel = t.select(0, 1);
  EXPECT_EQ(sel.shape(), (Shape{3, 4}));
  EXPECT_EQ(sel.item_f64(0), t.item_f64(12));
}

TEST(Tensor, DTypeConversionAndCopy) {
  auto v = test::randn(100);
  Tensor f = Tensor::from_f32({10, 10}, v);
  Tensor b = f.to(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  auto acc = test::compare(b, f);
  EXPECT_LT(acc.rel_l2, 1e-2);
  EXPECT_GT(acc.rel_l2, 0.0);
  Tensor d = Tensor::empty({10, 10}, DType::F32);
  test::poison(d);
  d.copy_(b);
  EXPECT_EQ(test::compare(d, b).max_abs, 0.0);
  Tensor tr = Tensor::empty({10, 10}, DType::F32);
  tr.permute({1, 0}).copy_(f);  // strided destination
  EXPECT_EQ(tr.item_f64(1), f.item_f64(10));
}

TEST(Tensor, CudaWithoutGpuIsClearError) {
  if (test::gpu_available()) GTEST_SKIP() << "a GPU is present";
  try {
    Tensor::empty({4}, DType::F32, Device::cuda(0));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).size(), 0u);
  }
}

TEST(ThreadPool, CoversRangeOnceAndPropagatesErrors) {
  std::vector<int> hits(10007, 0);
  parallel_for(int64_t(hits.size()), 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
  });
  for (int h : hits) ASSERT_EQ(h, 1);
  EXPECT_THROW(parallel_for(1000, 1, [](int64_t b, int64_t) {
                 if (b > 500) fail(ErrorKind::Internal, "boom");
               }),
               Error);
}

TEST(Harness, CompareMetrics) {
  std::vector<double> r{1, 2, 3}, o{1, 2, 3.3};
  auto a = test::compare(o, r);
  EXPECT_NEAR(a.rel_l2, 0.3 / std::sqrt(14.0), 1e-12);
  EXPECT_NEAR(a.max_abs, 0.3, 1e-12);
  o[0] = NAN;
  EXPECT_EQ(test::compare(o, r).nonfinite, 1u);
}

}  // namespace
}  // namespace td

namespace td {
namespace {
TEST(Tensor, HostileShapesAndStridesAreRejected) {
  auto st = Storage::allocate(64, Device::cpu());
  EXPECT_THROW(Tensor(st, DType::F32, {int64_t(1) << 62, 2}, {1, int64_t(1) << 62}), Error);
  EXPECT_THROW(Tensor(st, DType::F32, {3}, {int64_t(1) << 62}), Error);
  EXPECT_THROW(Tensor::empty({int64_t(1) << 40, int64_t(1) << 40}, DType::F32), Error);
  EXPECT_NO_THROW(Tensor(st, DType::F32, {0, int64_t(1) << 62}, {1, 1}));  // empty: no bytes needed
}
}  // namespace
}  // namespace td

namespace td {
namespace {
// stderr redirected to a file (not a terminal): the bar prints one final line
// with the label and the count, and nothing while disabled.
std::string capture_stderr(const std::function<void()>& fn) {
  const std::string path = test::temp_dir() + "/stderr_capture.txt";
  std::fflush(stderr);
  const int saved = dup(2);
  FILE* f = std::fopen(path.c_str(), "w");
  dup2(fileno(f), 2);
  fn();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::fclose(f);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Progress, FinalLineOnAPipeAndSilentWhenDisabled) {
  std::string out = capture_stderr([] {
    ProgressBar bar("denoising", 4, "steps");
    for (int i = 0; i < 4; ++i) bar.advance();
    bar.finish();
  });
  EXPECT_NE(out.find("denoising"), std::string::npos) << out;
  EXPECT_NE(out.find("4/4 steps"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  set_progress_enabled(false);
  out = capture_stderr([] {
    ProgressBar bar("quiet", 2);
    bar.advance(2);
  });
  set_progress_enabled(true);
  EXPECT_TRUE(out.empty()) << out;
}

TEST(Log, LevelsAndOnce) {
  const LogLevel saved = log_level();
  set_log_level(LogLevel::Warn);
  std::string out = capture_stderr([] {
    log_info("hidden");
    log_warn("shown ", 42);
    log_once(LogLevel::Warn, "k", "once");
    log_once(LogLevel::Warn, "k", "once");
  });
  set_log_level(saved);
  EXPECT_EQ(out.find("hidden"), std::string::npos) << out;
  EXPECT_NE(out.find("shown 42"), std::string::npos) << out;
  EXPECT_EQ(out.find("once"), out.rfind("once")) << out;
}
}  // namespace
}  // namespace td
