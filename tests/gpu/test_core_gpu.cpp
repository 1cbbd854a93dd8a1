// Core on a real GPU: device tensors, host<->device copies, the pool's peak
// accounting, streams and events.
#include "core/cuda_runtime.h"
#include "core/tensor.h"
#include "harness/harness.h"

namespace td {
namespace {

TEST(CoreGpu, RoundTripAndPeakTracking) {
  TD_REQUIRE_GPU();
  cuda::reset_peak(0);
  const size_t before = cuda::allocated_bytes(0);
  Tensor h = test::randn_tensor({1031, 77}, DType::BF16);
  {
    Tensor d = h.to(Device::cuda(0));
    EXPECT_TRUE(d.device().is_cuda());
    EXPECT_GE(cuda::allocated_bytes(0), before + h.nbytes());
    Tensor d2 = d.clone();
    Tensor back = d2.to(Device::cpu());
    EXPECT_EQ(test::compare(back, h).max_abs, 0.0);
    Tensor z = Tensor::zeros({513}, DType::F32, Device::cuda(0));
    for (float v : z.to_f32_vector()) ASSERT_EQ(v, 0.0f);
  }
  cuda::synchronize(0);
  EXPECT_EQ(cuda::allocated_bytes(0), before);
  EXPECT_GE(cuda::peak_allocated_bytes(0), before + 2 * h.nbytes());
}

TEST(CoreGpu, OutOfMemoryIsAClearError) {
  TD_REQUIRE_GPU();
  try {
    Tensor::empty({int64_t(1) << 50}, DType::U8, Device::cuda(0));  // 1 PiB
    FAIL() << "expected OutOfMemory";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory) << e.what();
    EXPECT_NE(std::string(e.what()).find("asked for"), std::string::npos) << e.what();
  }
  // the device is still usable afterwards
  Tensor ok = Tensor::zeros({16}, DType::F32, Device::cuda(0));
  EXPECT_EQ(ok.to_f32_vector()[3], 0.0f);
}

TEST(CoreGpu, StreamsAndEvents) {
  TD_REQUIRE_GPU();
  cuda::Stream s(0);
  cuda::Event a, b;
  a.record(s.native());
  b.record(s.native());
  b.synchronize();
  EXPECT_GE(cuda::Event::elapsed_ms(a, b), 0.0f);
  auto info = cuda::device_info(0);
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GT(info.total_memory, 0u);
}

}  // namespace
}  // namespace td
