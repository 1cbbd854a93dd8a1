// The .pth writer's ZIP64 paths (issue 4) without writing 4 GiB: the threshold
// at which sizes and offsets get ZIP64 records is lowered for the test
// (io::detail::set_pth_zip64_threshold_for_tests), and a second file has more
// than 65535 entries (the entry count alone needs the ZIP64 end records). Both
// read back through io/pth.h bit for bit and, when python3 can import torch,
// through torch.load(weights_only=True) (the 65535+ entry file only with
// TURBODIFF_SLOW_TESTS=1: it ran, taking ~50 s, on 2026-11-30).
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "harness/harness.h"
#include "io/mapped_file.h"
#include "io/pth.h"
#include "io/pth_writer.h"
#include "io/safetensors.h"

namespace td {
namespace {

// Bytes of the whole file.
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

size_t count_signature(const std::string& bytes, uint32_t sig) {
  char s[4];
  std::memcpy(s, &sig, 4);
  size_t n = 0;
  for (size_t p = bytes.find(std::string(s, 4)); p != std::string::npos; p = bytes.find(std::string(s, 4), p + 1)) ++n;
  return n;
}

void expect_same(const io::TensorFile& f, const std::vector<std::pair<std::string, Tensor>>& sd) {
  ASSERT_EQ(f.tensors.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    ASSERT_EQ(f.tensors[i].first, sd[i].first);
    const Tensor& r = f.tensors[i].second;
    ASSERT_EQ(r.dtype(), sd[i].second.dtype()) << sd[i].first;
    ASSERT_EQ(r.shape(), sd[i].second.shape()) << sd[i].first;
    ASSERT_EQ(std::memcmp(r.contiguous().raw_data(), sd[i].second.contiguous().raw_data(), r.nbytes()), 0)
        << sd[i].first;
  }
}

// torch.load -> safetensors -> our reader, compared with the originals (skips without torch).
void expect_torch_loads(const std::string& pth, const std::vector<std::pair<std::string, Tensor>>& sd) {
  if (std::system("python3 -c 'import torch, safetensors' >/dev/null 2>&1") != 0) {
    std::printf("torch.load check skipped: python3 cannot import torch and safetensors\n");
    return;
  }
  const std::string dir = test::temp_dir();
  std::ofstream(dir + "/zip64_check.py") << "import sys, torch\n"
                                            "from safetensors.torch import save_file\n"
                                            "sd = torch.load(sys.argv[1], weights_only=True)\n"
                                            "save_file({k: v.contiguous() for k, v in sd.items()}, sys.argv[2])\n";
  const std::string back = pth + ".back.safetensors";
  const int rc = std::system(("python3 " + dir + "/zip64_check.py " + pth + " " + back).c_str());
  ASSERT_EQ(rc, 0) << "torch.load failed on " << pth;
  std::map<std::string, Tensor> m;
  for (auto& [n, t] : io::read_safetensors(back).tensors) m[n] = t;
  ASSERT_EQ(m.size(), sd.size());
  for (const auto& [n, t] : sd) {
    ASSERT_TRUE(m.count(n)) << n;
    ASSERT_EQ(m[n].shape(), t.shape()) << n;
    ASSERT_EQ(std::memcmp(m[n].raw_data(), t.contiguous().raw_data(), t.nbytes()), 0) << n;
  }
}

struct ThresholdGuard {
  explicit ThresholdGuard(uint64_t b) : old(io::detail::set_pth_zip64_threshold_for_tests(b)) {}
  ~ThresholdGuard() { io::detail::set_pth_zip64_threshold_for_tests(old); }
  uint64_t old;
};

TEST(PthZip64, SizesAndOffsetsPastTheThresholdReadBack) {
  std::vector<std::pair<std::string, Tensor>> sd;
  sd.emplace_back("small", test::randn_tensor({3}, DType::F32));              // below: 32-bit fields
  sd.emplace_back("big", test::randn_tensor({1000, 3}, DType::BF16));         // 6000 bytes: ZIP64 sizes
  sd.emplace_back("after_big", test::randn_tensor({5, 7}, DType::F32));       // offset past: ZIP64 offset
  sd.emplace_back("exactly", test::randn_tensor({1024}, DType::F32));         // 4096 bytes = the threshold
  Tensor q = Tensor::empty({4097}, DType::I8);
  for (int64_t i = 0; i < q.numel(); ++i) q.data<int8_t>()[i] = int8_t(int(test::rng()() % 256) - 128);
  sd.emplace_back("int8", q);
  const std::string path = test::temp_dir() + "/zip64_threshold.pth";
  {
    const ThresholdGuard g(4096);
    io::write_pth(path, sd);
  }
  const std::string bytes = slurp(path);
  EXPECT_EQ(count_signature(bytes, 0x06064b50u), 1u) << "ZIP64 end of central directory record";
  EXPECT_EQ(count_signature(bytes, 0x07064b50u), 1u) << "ZIP64 end of central directory locator";
  expect_same(io::read_pth(path), sd);
  expect_torch_loads(path, sd);

  // The default threshold writes none of it for the same small file.
  const std::string plain = test::temp_dir() + "/zip64_plain.pth";
  io::write_pth(plain, sd);
  EXPECT_EQ(count_signature(slurp(plain), 0x06064b50u), 0u);
  expect_same(io::read_pth(plain), sd);
}

TEST(PthZip64, MoreThan65535EntriesReadBack) {
  // 65540 one-element tensors: + data.pkl, byteorder, version = 65543 zip entries.
  std::vector<std::pair<std::string, Tensor>> sd;
  const int64_t n = 65540;
  sd.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    Tensor t = Tensor::empty({1}, DType::I32);
    t.data<int32_t>()[0] = int32_t(i * 7 - 3);
    sd.emplace_back(cat("t.", i), t);
  }
  const std::string path = test::temp_dir() + "/zip64_entries.pth";
  io::write_pth(path, sd);
  const std::string bytes = slurp(path);
  EXPECT_EQ(count_signature(bytes, 0x06064b50u), 1u);
  expect_same(io::read_pth(path), sd);
  // torch.load of 65540 tensors takes about a minute on a CI machine; the
  // threshold test above already has torch read the ZIP64 end records.
  if (std::getenv("TURBODIFF_SLOW_TESTS"))
    expect_torch_loads(path, sd);
  else
    std::printf("torch.load of the 65540-entry file: set TURBODIFF_SLOW_TESTS=1 to run it\n");
}

}  // namespace
}  // namespace td
