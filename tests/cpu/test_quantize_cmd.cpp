// `turbodiff quantize` and `turbodiff dit --quant-linear` on the tiny Wan
// fixtures (fixtures/dit/t2v): the output follows TurboDiffusion's -quant
// format tensor by tensor, `info` reports it as INT8, the W8A8 forward of the
// quantized file stays close to the float model, and re-quantizing an INT8
// checkpoint or asking for a .pth is a clear error.
#include <cstring>
#include <filesystem>

#include "harness/harness.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "kernels/quant/quant_block128.h"
#include "kernels/quant/quant_common.h"

namespace td {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/dit/" + rel; }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
bool ends_with(const std::string& s, const std::string& x) {
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

std::map<std::string, Tensor> read_map(const std::string& path) {
  std::map<std::string, Tensor> m;
  for (auto& [n, t] : io::read_tensor_file(path).tensors) m[n] = t;
  return m;
}

bool is_block_linear(const std::string& base) {
  for (const char* l : {".self_attn.q", ".self_attn.k", ".self_attn.v", ".self_attn.o", ".cross_attn.q",
                        ".cross_attn.k", ".cross_attn.v", ".cross_attn.o", ".ffn.0", ".ffn.2"})
    if (base.rfind("blocks.", 0) == 0 && ends_with(base, l)) return true;
  return false;
}

TEST(QuantizeCmd, WritesTurboDiffusionInt8Format) {
  const std::string dir = test::temp_dir(), out = dir + "/q.safetensors";
  const std::string src = fixture("t2v/wan_original.safetensors");
  const auto r = test::run_cli("quantize " + src + " " + out + " --config " + fixture("t2v/config.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto in = read_map(src);
  const auto q = read_map(out);
  // Every block linear weight is replaced by int8_weight + scale; everything else
  // (bias included) is byte-identical under the same original name.
  size_t linears = 0;
  for (const auto& [name, t] : in) {
    const std::string base = ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : "";
    if (!base.empty() && is_block_linear(base)) {
      ++linears;
      EXPECT_FALSE(q.count(name)) << name;
      ASSERT_TRUE(q.count(base + ".int8_weight") && q.count(base + ".scale")) << base;
      const Tensor& qi = q.at(base + ".int8_weight");
      const Tensor& sc = q.at(base + ".scale");
      const int64_t N = t.size(0), K = t.size(1);
      EXPECT_EQ(qi.dtype(), DType::I8);
      EXPECT_EQ(qi.shape(), (Shape{N, K}));
      EXPECT_EQ(sc.dtype(), DType::F32);
      EXPECT_EQ(sc.shape(), (Shape{kernels::quant_groups(N), kernels::quant_groups(K)}));
      // The codes and scales of TurboDiffusion's 128x128 quantizer (quant_block128.h).
      const Tensor tc = t.contiguous();
      std::vector<int8_t> codes(static_cast<size_t>(N * K));
      std::vector<float> scales(static_cast<size_t>(sc.numel()));
      ASSERT_EQ(kernels::quantize_block128_cpu(t.dtype() == DType::BF16 ? kernels::ElemType::BF16 : kernels::ElemType::F32,
                                               tc.raw_data(), N, K, K, codes.data(), K, scales.data()),
                kernels::Status::Ok);
      EXPECT_EQ(std::memcmp(codes.data(), qi.contiguous().raw_data(), codes.size()), 0) << base;
      EXPECT_EQ(std::memcmp(scales.data(), sc.contiguous().raw_data(), scales.size() * 4), 0) << base;
      continue;
    }
    ASSERT_TRUE(q.count(name)) << name << " missing from the quantized file";
    const Tensor& o = q.at(name);
    EXPECT_EQ(o.dtype(), t.dtype()) << name;
    EXPECT_EQ(o.shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(o.contiguous().raw_data(), t.contiguous().raw_data(), t.nbytes()), 0) << name;
  }
  EXPECT_EQ(linears, 20u);  // 2 blocks x 10
  EXPECT_EQ(q.size(), in.size() + linears);

  // `info` recognises it as a TurboDiffusion INT8 checkpoint.
  const auto info = test::run_cli("info " + out);
  EXPECT_EQ(info.exit_code, 0) << info.err;
  EXPECT_TRUE(contains(info.out, "TurboDiffusion INT8")) << info.out;

  // Re-quantizing it is an error that names the INT8 tensor; nothing is written.
  const auto again = test::run_cli("quantize " + out + " " + dir + "/qq.safetensors");
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_TRUE(contains(again.err, "already INT8") && contains(again.err, ".int8_weight")) << again.err;
  EXPECT_FALSE(fs::exists(dir + "/qq.safetensors"));
  // A .pth name with --format safetensors is a usage error (nothing written).
  const auto mixed = test::run_cli("quantize " + src + " " + dir + "/q.pth --format safetensors");
  EXPECT_EQ(mixed.exit_code, 2);
  EXPECT_TRUE(contains(mixed.err, "torch extension")) << mixed.err;
  EXPECT_FALSE(fs::exists(dir + "/q.pth"));
  // --format pth (auto for *.pth): the same tensors, readable by io/pth.h.
  const auto pth = test::run_cli("quantize " + src + " " + dir + "/q.pth --config " + fixture("t2v/config.json"));
  ASSERT_EQ(pth.exit_code, 0) << pth.err;
  const auto qp = read_map(dir + "/q.pth");
  ASSERT_EQ(qp.size(), q.size());
  for (const auto& [name, t] : q) {
    ASSERT_TRUE(qp.count(name)) << name;
    EXPECT_EQ(qp.at(name).dtype(), t.dtype()) << name;
    EXPECT_EQ(qp.at(name).shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(qp.at(name).contiguous().raw_data(), t.contiguous().raw_data(), t.nbytes()), 0) << name;
  }
  const auto pinfo = test::run_cli("info " + dir + "/q.pth");
  EXPECT_TRUE(contains(pinfo.out, "TurboDiffusion INT8")) << pinfo.out << pinfo.err;
  // Not a DiT.
  const auto bad = test::run_cli("quantize " + fixture("t2v/inputs.safetensors") + " " + dir + "/x.safetensors");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(contains(bad.err, "not a Wan DiT")) << bad.err;
}

TEST(QuantizeCmd, QuantizedModelRunsW8A8CloseToFloat) {
  const std::string dir = test::temp_dir(), q = dir + "/q.safetensors";
  const std::string cfg = " --config " + fixture("t2v/config.json");
  const std::string in = " --inputs " + fixture("t2v/inputs.safetensors") + " --device cpu";
  ASSERT_EQ(test::run_cli("quantize " + fixture("t2v/wan_original.safetensors") + " " + q + cfg).exit_code, 0);
  auto r = test::run_cli("dit --weights " + fixture("t2v/wan_original.safetensors") + cfg + in + " --out " + dir +
                         "/float.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Tensor ref = io::read_safetensors(dir + "/float.safetensors").tensors.at(0).second;
  // Bound 3e-2 for every variant: each INT8 linear adds ~1% relative error
  // (weight rounding ~0.9%, activation rounding 0.3-0.5% on these N(0,1)-like
  // inputs, independent and adding in quadrature); the tiny model's residual
  // stream and norms keep the 20 linears' errors from compounding (measured
  // 0.9-1.1e-2 for the three variants, 0.7e-2 for the weights alone).
  for (const char* v : {"token128", "block128", "post-scale"}) {
    const std::string out = dir + "/w8a8_" + v + ".safetensors";
    r = test::run_cli("dit --weights " + q + cfg + in + " --quant-linear --int8-variant " + v + " --out " + out);
    ASSERT_EQ(r.exit_code, 0) << v << ": " << r.err;
    EXPECT_TRUE(contains(r.out, "W8A8") && contains(r.out, "20 INT8 from the checkpoint")) << r.out;
    const Tensor y = io::read_safetensors(out).tensors.at(0).second;
    SCOPED_TRACE(v);
    const test::Accuracy acc = test::compare(y, ref);
    TD_EXPECT_CLOSE(acc, 3e-2, 0.999);
    EXPECT_GT(acc.rel_l2, 1e-4) << "the INT8 path must differ from the float one (did it run?)";
  }
  // The float checkpoint with --quant-linear (weights quantized at load) gives
  // the same numbers as the quantized file: same quantizer, same codes.
  r = test::run_cli("dit --weights " + fixture("t2v/wan_original.safetensors") + cfg + in +
                    " --quant-linear --out " + dir + "/atload.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "20 quantized at load")) << r.out;
  const Tensor a = io::read_safetensors(dir + "/atload.safetensors").tensors.at(0).second;
  const Tensor b = io::read_safetensors(dir + "/w8a8_token128.safetensors").tensors.at(0).second;
  TD_EXPECT_CLOSE(test::compare(a, b), 1e-6, 1 - 1e-9);
  // Without --quant-linear the INT8 file is dequantized at load, with its log line.
  r = test::run_cli("dit --weights " + q + cfg + in + " --out " + dir + "/deq.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "dequantized") && contains(r.err, "--quant-linear")) << r.err;
  TD_EXPECT_CLOSE(test::compare(io::read_safetensors(dir + "/deq.safetensors").tensors.at(0).second, ref), 2e-2,
                  0.999);
  // --int8-variant without --quant-linear would be silently ignored: a usage error instead.
  r = test::run_cli("dit --weights " + q + cfg + in + " --int8-variant post-scale --out " + dir + "/x.safetensors");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--quant-linear")) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/x.safetensors"));
}

TEST(QuantizeCmd, TurboDiffusionQuantCheckpointRunsW8A8) {
  // TurboDiffusion's own -quant layout (fixtures/dit/t2v/turbo_quant.pth): loads
  // as it is and runs close to its dequantized forward (the fixture's velocity_int8).
  const std::string dir = test::temp_dir();
  const auto r = test::run_cli("dit --weights " + fixture("t2v/turbo_quant.pth") + " --inputs " +
                               fixture("t2v/inputs.safetensors") + " --device cpu --quant-linear --out " + dir +
                               "/v.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, Tensor> expected;
  for (auto& [n, t] : io::read_safetensors(fixture("t2v/expected.safetensors")).tensors) expected[n] = t;
  ASSERT_TRUE(expected.count("velocity_int8"));
  // Only the activation rounding differs from the dequantized-weight forward (~0.5%).
  TD_EXPECT_CLOSE(test::compare(io::read_safetensors(dir + "/v.safetensors").tensors.at(0).second,
                                expected.at("velocity_int8")),
                  2e-2, 0.999);
}

}  // namespace
}  // namespace td
