// `turbodiff info` on the fixtures written by scripts/make_io_fixtures.py
// (torch + safetensors): names, dtypes, shapes and model kind; and bad files
// give one clear message and exit 1.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "harness/harness.h"

namespace td {
namespace {

std::string fixture(const std::string& name) { return test::source_dir() + "/fixtures/io/" + name; }

nlohmann::json info_json(const std::string& path) {
  auto r = test::run_cli("info --json '" + path + "'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

// Every tensor `info` lists matches expected.json (written by the fixture script from torch itself).
void expect_matches_expected(const nlohmann::json& info, const std::string& expected_key) {
  std::ifstream f(fixture("expected.json"));
  ASSERT_TRUE(f) << "fixtures/io/expected.json missing";
  auto expected = nlohmann::json::parse(f);
  ASSERT_TRUE(expected["files"].contains(expected_key)) << expected_key;
  const auto& exp_tensors = expected["files"][expected_key]["tensors"];
  std::map<std::string, nlohmann::json> got;
  for (const auto& t : info["tensors"]) got[t["name"].get<std::string>()] = t;
  EXPECT_EQ(got.size(), exp_tensors.size());
  for (const auto& e : exp_tensors) {
    const std::string name = e["name"].get<std::string>();
    ASSERT_TRUE(got.count(name)) << "info does not list " << name;
    EXPECT_EQ(got[name]["shape"], e["shape"]) << name;
    EXPECT_EQ(got[name]["dtype"], e["dtype"]) << name;
  }
}

TEST(Info, WanOriginalPthAndSafetensors) {
  for (const char* f : {"wan_t2v_tiny.pth", "wan_t2v_tiny.safetensors"}) {
    auto j = info_json(fixture(f));
    EXPECT_EQ(j["model"]["kind"], "wan-dit") << f;
    EXPECT_EQ(j["model"]["layout"], "original") << f;
    EXPECT_EQ(j["model"]["num_layers"], 2) << f;
    EXPECT_EQ(j["model"]["in_dim"], 16) << f;
    EXPECT_FALSE(j["model"]["int8_quantized"].get<bool>());
    EXPECT_FALSE(j["model"]["sla_proj_l"].get<bool>());
    expect_matches_expected(j, f);
  }
}

TEST(Info, TurboDiffusionLayouts) {
  auto j = info_json(fixture("turbo_tiny.pth"));
  EXPECT_EQ(j["model"]["prefix"], "state_dict.net.");
  EXPECT_TRUE(j["model"]["sla_proj_l"].get<bool>());
  EXPECT_TRUE(j["model"]["patch_embedding_linear"].get<bool>());
  expect_matches_expected(j, "turbo_tiny.pth");
  j = info_json(fixture("turbo_tiny_quant.pth"));
  EXPECT_TRUE(j["model"]["int8_quantized"].get<bool>());
  EXPECT_TRUE(j["model"]["sla_proj_l"].get<bool>());
  EXPECT_GT(j["dtypes"]["i8"]["tensors"].get<int>(), 0);
  expect_matches_expected(j, "turbo_tiny_quant.pth");
}

TEST(Info, ShardedDiffusersByIndexAndByFolder) {
  auto by_folder = info_json(fixture("diffusers_tiny"));
  EXPECT_EQ(by_folder["format"], "safetensors-sharded");
  EXPECT_EQ(by_folder["model"]["layout"], "diffusers");
  EXPECT_EQ(by_folder["model"]["kind"], "wan-dit");
  auto by_index = info_json(fixture("diffusers_tiny/diffusion_pytorch_model.safetensors.index.json"));
  EXPECT_EQ(by_index["tensor_count"], by_folder["tensor_count"]);
  EXPECT_EQ(by_index["total_bytes"], by_folder["total_bytes"]);
}

TEST(Info, SeveralFilesGiveAnArray) {
  auto r = test::run_cli("info --json --summary '" + fixture("wan_t2v_tiny.pth") + "' '" + fixture("turbo_tiny.pth") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  EXPECT_EQ(j.size(), 2u);
  EXPECT_FALSE(j[0].contains("tensors"));
}

TEST(Info, BadFilesExitOneWithTheFileNamed) {
  const std::string dir = test::temp_dir();
  // truncated copies of real fixtures, at several cut points
  for (const char* f : {"wan_t2v_tiny.pth", "wan_t2v_tiny.safetensors"}) {
    const auto size = std::filesystem::file_size(fixture(f));
    for (double frac : {0.0, 0.001, 0.3, 0.7, 0.999}) {
      const std::string out = dir + "/truncated_" + std::to_string(int(frac * 1000)) + "_" + f;
      std::filesystem::copy_file(fixture(f), out, std::filesystem::copy_options::overwrite_existing);
      std::filesystem::resize_file(out, size_t(double(size) * frac));
      auto r = test::run_cli("info '" + out + "'");
      EXPECT_EQ(r.exit_code, 1) << out << ": " << r.out << r.err;
      EXPECT_NE(r.err.find(out), std::string::npos) << "message does not name the file: " << r.err;
    }
  }
  auto r = test::run_cli("info /nonexistent/model.pth");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/model.pth"), std::string::npos) << r.err;
  r = test::run_cli("info '" + fixture("legacy_tiny.pth") + "'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("legacy"), std::string::npos) << r.err;
  r = test::run_cli("info");
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace td
