// io::write_pth: what it writes reads back through io/pth.h bit for bit, and
// (when python3 can import torch) torch.load(weights_only=True) reads it as the
// same state dict.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "harness/harness.h"
#include "io/pth.h"
#include "io/pth_writer.h"
#include "io/safetensors.h"

namespace td {
namespace {

std::vector<std::pair<std::string, Tensor>> random_state_dict() {
  std::vector<std::pair<std::string, Tensor>> sd;
  sd.emplace_back("blocks.0.self_attn.q.int8_weight", Tensor::empty({37, 130}, DType::I8));
  auto& q = sd.back().second;
  for (int64_t i = 0; i < q.numel(); ++i) q.data<int8_t>()[i] = int8_t(int(test::rng()() % 256) - 128);
  sd.emplace_back("blocks.0.self_attn.q.scale", test::randn_tensor({1, 2}, DType::F32));
  sd.emplace_back("blocks.0.self_attn.q.bias", test::randn_tensor({37}, DType::BF16));
  sd.emplace_back("patch_embedding.weight", test::randn_tensor({8, 4, 1, 2, 2}, DType::F16));
  sd.emplace_back("f64", test::randn_tensor({3, 5}, DType::F64));
  Tensor ids = Tensor::empty({6}, DType::I64);
  for (int64_t i = 0; i < 6; ++i) ids.data<int64_t>()[i] = (int64_t(1) << 40) * (i - 3);
  sd.emplace_back("ids", ids);
  sd.emplace_back("scalar", test::randn_tensor({}, DType::F32));
  // A non-contiguous view: written contiguous.
  sd.emplace_back("transposed", test::randn_tensor({4, 6}, DType::F32).permute({1, 0}));
  return sd;
}

TEST(PthWriter, ReadsBackThroughOurReader) {
  const std::string path = test::temp_dir() + "/sd.pth";
  const auto sd = random_state_dict();
  io::write_pth(path, sd);
  const io::TensorFile f = io::read_pth(path);
  ASSERT_EQ(f.tensors.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    const auto& [name, t] = sd[i];
    EXPECT_EQ(f.tensors[i].first, name);  // order kept
    const Tensor& r = f.tensors[i].second;
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(r.contiguous().raw_data(), t.contiguous().raw_data(), t.nbytes()), 0) << name;
  }
  // Errors: duplicate names; nothing left behind.
  const std::string bad = test::temp_dir() + "/dup.pth";
  EXPECT_THROW(io::write_pth(bad, {{"a", sd[1].second}, {"a", sd[2].second}}), Error);
  EXPECT_FALSE(std::filesystem::exists(bad));
}

TEST(PthWriter, TorchLoadReadsIt) {
  if (std::system("python3 -c 'import torch' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 cannot import torch";
  const std::string dir = test::temp_dir();
  const auto sd = random_state_dict();
  io::write_pth(dir + "/sd.pth", sd);
  // torch loads it (weights_only: only the allowed globals) and re-saves it as
  // safetensors, which our reader compares with the originals.
  std::ofstream(dir + "/check.py") << "import sys, torch\n"
                                      "from safetensors.torch import save_file\n"
                                      "sd = torch.load(sys.argv[1], weights_only=True)\n"
                                      "assert type(sd).__name__ == 'OrderedDict', type(sd)\n"
                                      "save_file({k: v.contiguous() for k, v in sd.items()}, sys.argv[2])\n";
  const int rc = std::system(("python3 " + dir + "/check.py " + dir + "/sd.pth " + dir + "/back.safetensors").c_str());
  ASSERT_EQ(rc, 0) << "torch.load failed on the written file";
  std::map<std::string, Tensor> back;
  for (auto& [n, t] : io::read_safetensors(dir + "/back.safetensors").tensors) back[n] = t;
  ASSERT_EQ(back.size(), sd.size());
  for (const auto& [name, t] : sd) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_EQ(back[name].dtype(), t.dtype()) << name;
    EXPECT_EQ(back[name].shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(back[name].raw_data(), t.contiguous().raw_data(), t.nbytes()), 0) << name;
  }
}

}  // namespace
}  // namespace td
