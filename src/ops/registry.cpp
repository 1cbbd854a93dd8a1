#include "ops/registry.h"

#include <sstream>

#include "ops/smoke.h"

namespace td::ops {
const std::vector<KernelFamily>& kernel_families() {
  static const std::vector<KernelFamily> families = [] {
    std::vector<KernelFamily> f;
    f.push_back({"norm", "RMSNorm, LayerNorm, AdaLN modulate, fused residual+gate+norm (FastNorm)", false,
                 smoke::norm_family});
    f.push_back({"elementwise", "GELU-tanh, SiLU, broadcasting add/mul", false, smoke::elementwise_family});
    f.push_back({"quant", "INT8 activation/weight quantizers (128x128 blocks, 1x128 token groups, per row), fused LN+modulate+quantize",
                 false, smoke::quant_family});
    f.push_back({"rope", "Q/K RMSNorm over the model dim fused with Wan's 3-D RoPE; the RoPE alone (--default-norm)",
                 false, smoke::rope_family});
    f.push_back({"layout", "Wan patchify / unpatchify on the device; Philox random fills (bench e2e's random models)",
                 false, smoke::layout_family});
    f.push_back({"attention", "exact attention: cuDNN fused SDPA (when linked) and the portable flash kernel", false,
                 smoke::attention_family});
    f.push_back({"sla", "SLA: GPU block selection, BF16 block-sparse flash (128x64), linear branch + proj_l", false,
                 smoke::sla_family});
#if __has_include("ops/sage_attention.h")
    f.push_back({"sagesla", "SageSLA: SLA's selection (64x128) and linear branch around the SageAttention-style kernel",
                 false, smoke::sagesla_family});
#endif
    f.push_back({"sage", "SageAttention-style quantized attention: sm_90a (INT8 wgmma Q·K, e4m3 wgmma P·V, TMA, warp-specialized) and portable (INT8 mma.sync Q·K, FP16 P·V), dense and block-sparse",
                 false, smoke::sage_family});
    f.push_back({"t5_attention", "umT5 encoder attention with relative-position bias and key mask", false,
                 smoke::t5_attention_family});
    return f;
  }();
  return families;
}

std::vector<std::string> compiled_cuda_archs() {
  std::vector<std::string> out;
#ifdef TURBODIFF_CUDA_ARCH_LIST
  std::stringstream ss(TURBODIFF_CUDA_ARCH_LIST);
  std::string a;
  while (std::getline(ss, a, ';'))
    if (!a.empty()) out.push_back(a);
#endif
  return out;
}

std::vector<std::string> family_archs(const KernelFamily& family) {
  auto all = compiled_cuda_archs();
  if (!family.sm90a_only) return all;
  for (const auto& a : all)
    if (a == "90a") return {"90a"};
  return {};
}

bool archs_run_on(const std::vector<std::string>& archs, int cc_major, int cc_minor, std::string* how) {
  const int cc = cc_major * 10 + cc_minor;
  // Prefer native machine code; otherwise PTX JIT.
  for (const auto& a : archs) {
    const bool arch_specific = !a.empty() && (a.back() == 'a' || a.back() == 'f');
    const int v = std::stoi(arch_specific ? a.substr(0, a.size() - 1) : a);
    if (arch_specific ? v == cc : (v / 10 == cc_major && v % 10 <= cc_minor)) {
      if (how) *how = "sm_" + a + " machine code";
      return true;
    }
  }
  for (const auto& a : archs) {
    const bool arch_specific = !a.empty() && (a.back() == 'a' || a.back() == 'f');
    if (arch_specific) continue;
    if (std::stoi(a) <= cc) {
      if (how) *how = "JIT from compute_" + a + " PTX";
      return true;
    }
  }
  if (how) *how = "no compatible code";
  return false;
}

}  // namespace td::ops
