// Every registered kernel family's smoke run (the one `doctor` does) passes on
// this GPU, and the ops dispatch CUDA tensors to CUDA kernels.
#include "core/cuda_runtime.h"
#include "harness/harness.h"
#include "ops/norm.h"
#include "ops/registry.h"

namespace td::ops {
namespace {

TEST(OpsGpu, EveryFamilySmokePasses) {
  TD_REQUIRE_GPU();
  const auto info = cuda::device_info(0);
  for (const auto& f : kernel_families()) {
    if (!archs_run_on(family_archs(f), info.cc_major, info.cc_minor)) continue;
    ASSERT_TRUE(f.smoke) << f.name;
    for (const auto& [op, r] : f.smoke(0)) EXPECT_TRUE(r.ok) << f.name << "/" << op << ": " << r.detail;
  }
}

TEST(OpsGpu, NormOnDeviceStaysOnDevice) {
  TD_REQUIRE_GPU();
  Tensor x = test::randn_tensor({1000, 1536}, DType::BF16).to(Device::cuda(0));
  Tensor y = rms_norm(x, Tensor(), 1e-6f);
  EXPECT_TRUE(y.device().is_cuda());
  TD_EXPECT_CLOSE(test::compare(y, rms_norm(x.to(Device::cpu()), Tensor(), 1e-6f)), 1e-2, 0.9999);
}

}  // namespace
}  // namespace td::ops
