// The CLI contract: --help exits 0, usage errors exit 2, failures exit 1 with a
// message; doctor's JSON is valid and matches this machine.
#include <nlohmann/json.hpp>

#include "core/cuda_runtime.h"
#include "harness/harness.h"

namespace td {
namespace {

TEST(Cli, HelpAndVersionExitZero) {
  auto r = test::run_cli("--help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("doctor"), std::string::npos);
  EXPECT_NE(r.out.find("info"), std::string::npos);
  for (const char* sub : {"doctor", "info"}) {
    r = test::run_cli(std::string(sub) + " --help");
    EXPECT_EQ(r.exit_code, 0) << sub << ": " << r.err;
  }
  r = test::run_cli("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("turbodiff"), std::string::npos);
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(test::run_cli("").exit_code, 2);
  EXPECT_EQ(test::run_cli("no-such-command").exit_code, 2);
  auto r = test::run_cli("doctor --device -3");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  r = test::run_cli("doctor --device 57");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--device 57"), std::string::npos) << r.err;
}

TEST(Cli, DoctorJsonIsValidAndMatchesMachine) {
  auto r = test::run_cli("doctor --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["gpu_count"].get<int>(), cuda::device_count());
  EXPECT_EQ(j["built_with_cuda"].get<bool>(), cuda::built_with_cuda());
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_TRUE(j["libraries"].is_array());
  EXPECT_EQ(j["gpus"].size(), size_t(cuda::device_count()));
  for (const auto& g : j["gpus"]) {
    EXPECT_FALSE(g["name"].get<std::string>().empty());
    for (const auto& f : g["kernel_families"])
      for (const auto& s : f["smoke"]) EXPECT_TRUE(s["ok"].get<bool>()) << s.dump();
  }
}

TEST(Cli, DoctorRequireCudaFailsWithoutGpu) {
  if (test::gpu_available()) GTEST_SKIP() << "a GPU is present; the GPU run checks the passing side";
  auto r = test::run_cli("doctor --require-cuda");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--require-cuda"), std::string::npos) << r.out;
  r = test::run_cli("doctor --json --require-cuda");
  EXPECT_EQ(r.exit_code, 1);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["ok"].get<bool>());
  ASSERT_FALSE(j["failures"].empty());
  EXPECT_NE(j["failures"][0].get<std::string>().find("no usable CUDA GPU"), std::string::npos);
}

TEST(Cli, DoctorRequireSageslaFailsUntilBuilt) {
  auto r = test::run_cli("doctor --require-sagesla");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--require-sagesla"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace td
