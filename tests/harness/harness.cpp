#include "harness/harness.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace td::test {
namespace {

uint64_t g_seed = 0;
std::string g_seed_test;

}  // namespace

std::mt19937_64& rng() {
  static std::mt19937_64 gen;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
  if (name != g_seed_test || g_seed == 0) {
    g_seed_test = name;
    if (const char* e = std::getenv("TURBODIFF_TEST_SEED")) g_seed = std::strtoull(e, nullptr, 10);
    else g_seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}() ^ 1;
    gen.seed(g_seed);
    if (info) ::testing::Test::RecordProperty("seed", std::to_string(g_seed));
  }
  return gen;
}

uint64_t current_seed() {
  rng();
  return g_seed;
}

std::vector<float> randn(size_t n, float mean, float stddev) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  auto& g = rng();
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<float> randu(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  auto& g = rng();
  for (auto& x : v) x = d(g);
  return v;
}

Tensor randn_tensor(const Shape& shape, DType dtype, float stddev, float mean) {
  return Tensor::from_f32(shape, randn(size_t(shape_numel(shape)), mean, stddev), dtype);
}

void poison(void* data, size_t nbytes, DType dtype) {
  auto* b = static_cast<uint8_t*>(data);
  switch (dtype) {
    case DType::F32: { const uint32_t nan = 0x7fc00000u; for (size_t i = 0; i + 4 <= nbytes; i += 4) std::memcpy(b + i, &nan, 4); return; }
    case DType::F64: { const uint64_t nan = 0x7ff8000000000000ull; for (size_t i = 0; i + 8 <= nbytes; i += 8) std::memcpy(b + i, &nan, 8); return; }
    case DType::F16: { const uint16_t nan = 0x7e00; for (size_t i = 0; i + 2 <= nbytes; i += 2) std::memcpy(b + i, &nan, 2); return; }
    case DType::BF16: { const uint16_t nan = 0x7fc0; for (size_t i = 0; i + 2 <= nbytes; i += 2) std::memcpy(b + i, &nan, 2); return; }
    case DType::F8E4M3: std::memset(b, 0x7f, nbytes); return;
    default: std::memset(b, 0x5a, nbytes); return;
  }
}

void poison(Tensor& t) {
  if (t.device().is_cpu()) {
    poison(t.raw_data(), t.nbytes(), t.dtype());
    return;
  }
  std::vector<uint8_t> host(t.nbytes());
  poison(host.data(), host.size(), t.dtype());
  cuda::memcpy_sync(t.raw_data(), host.data(), host.size(), true);
}

std::string Accuracy::str() const {
  std::ostringstream os;
  os << "rel_l2=" << rel_l2 << " cosine=" << cosine << " rel_l1=" << rel_l1 << " max_abs=" << max_abs
     << " nonfinite=" << nonfinite << "/" << n << " seed=" << g_seed;
  return os.str();
}

Accuracy compare(const std::vector<double>& out, const std::vector<double>& ref) {
  Accuracy a;
  a.n = out.size();
  if (out.size() != ref.size()) {
    a.rel_l2 = INFINITY;
    a.nonfinite = out.size();
    return a;
  }
  double d2 = 0, r2 = 0, o2 = 0, dot = 0, d1 = 0, r1 = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = out[i], r = ref[i];
    if (!std::isfinite(o)) {
      ++a.nonfinite;
      continue;
    }
    const double d = o - r;
    d2 += d * d;
    r2 += r * r;
    o2 += o * o;
    dot += o * r;
    d1 += std::fabs(d);
    r1 += std::fabs(r);
    a.max_abs = std::max(a.max_abs, std::fabs(d));
  }
  a.rel_l2 = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
  a.cosine = (o2 > 0 && r2 > 0) ? dot / std::sqrt(o2 * r2) : (d2 == 0 ? 1.0 : 0.0);
  a.rel_l1 = r1 > 0 ? d1 / r1 : d1;
  return a;
}

static std::vector<double> to_f64(const Tensor& t) {
  Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<double> v(size_t(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) v[size_t(i)] = h.item_f64(i);
  return v;
}

Accuracy compare(const Tensor& out, const Tensor& ref) {
  if (out.shape() != ref.shape()) {
    ADD_FAILURE() << "compare: shapes differ: " << out.desc() << " vs " << ref.desc();
    Accuracy a;
    a.rel_l2 = INFINITY;
    return a;
  }
  return compare(to_f64(out), to_f64(ref));
}

bool gpu_available() { return cuda::device_count() > 0; }

// Both can be overridden from the environment, for test binaries carried to another
// machine (scripts/gpu_check.sh) where the build paths do not exist.
std::string source_dir() {
  const char* e = std::getenv("TURBODIFF_SOURCE_DIR");
  return e ? e : TURBODIFF_SOURCE_DIR;
}
std::string cli_path() {
  const char* e = std::getenv("TURBODIFF_CLI");
  return e ? e : std::string(TURBODIFF_BINARY_DIR) + "/turbodiff";
}

std::string temp_dir() {
  static std::string dir = [] {
    char tmpl[] = "/tmp/turbodiff-test-XXXXXX";
    const char* d = mkdtemp(tmpl);
    std::string s = d ? d : "/tmp";
    static struct Cleanup {
      std::string path;
      ~Cleanup() {
        std::error_code ec;
        if (path != "/tmp") std::filesystem::remove_all(path, ec);
      }
    } cleanup{s};
    return s;
  }();
  return dir;
}

static std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

CliResult run_cli(const std::string& args) {
  static int counter = 0;
  const std::string base = temp_dir() + "/cli" + std::to_string(getpid()) + "_" + std::to_string(counter++);
  const std::string cmd = cli_path() + " " + args + " >" + base + ".out 2>" + base + ".err </dev/null";
  const int rc = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

}  // namespace td::test
