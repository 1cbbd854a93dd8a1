// pdl.cuh's host side.
#include "kernels/pdl.cuh"

#include <atomic>
#include <cstdlib>

namespace td::kernels {

bool pdl_enabled() {
  static const bool env_off = [] {
    const char* e = std::getenv("TURBODIFF_PDL");
    return e && e[0] == '0';
  }();
  if (env_off) return false;
  constexpr int kMaxDevices = 64;
  static std::atomic<int> major_of[kMaxDevices] = {};  // 0: not asked yet, -1: the query failed
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
  int major = major_of[dev].load(std::memory_order_relaxed);
  if (major == 0) {
    int m = 0;
    major = cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess ? m : -1;
    major_of[dev].store(major, std::memory_order_relaxed);
  }
  return major >= 9;
}

}  // namespace td::kernels
