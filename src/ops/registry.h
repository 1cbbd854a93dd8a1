// The one registry of kernel families: which backends exist in this build, for
// which CUDA architectures they were compiled, whether they can run on a given
// GPU, and a smoke test that runs each on tiny inputs against its CPU
// reference. `turbodiff doctor` prints it; the ops dispatch consults it.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace td::ops {

// Result of one smoke run of a CUDA kernel against its CPU reference.
struct SmokeResult {
  bool ok = false;
  std::string detail;  // metric or the error
};

struct KernelFamily {
  std::string name;         // "norm", "elementwise", "quant", "rope", ...
  std::string description;  // one line
  bool sm90a_only = false;  // built only for sm_90a (wgmma/TMA kernels)
  // Runs the family's CUDA kernels on device `device` against the CPU reference.
  std::function<std::vector<std::pair<std::string, SmokeResult>>(int device)> smoke;
};

// All families compiled into this binary (CPU references always exist).
const std::vector<KernelFamily>& kernel_families();

// The CUDA architectures this binary was built for, e.g. {"90a", "80"}; empty without CUDA.
std::vector<std::string> compiled_cuda_archs();
// The archs of `family` (the global list, or just 90a for sm90a-only families).
std::vector<std::string> family_archs(const KernelFamily& family);
// Whether code built for `archs` can run on a GPU of compute capability major.minor,
// either as machine code (same major, minor <= the GPU's; "a" targets need an exact match)
// or by JIT from embedded PTX (non-"a" targets at or below the GPU's capability).
bool archs_run_on(const std::vector<std::string>& archs, int cc_major, int cc_minor, std::string* how = nullptr);

// The families, listed explicitly in registry.cpp (one place; no static
// registration, which a static library's linker would silently drop). Each
// factory lives beside the family's ops in ops/<family>_*.cpp.

}  // namespace td::ops
