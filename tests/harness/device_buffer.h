// A device copy of a host buffer for the GPU kernel tests (Rows including its
// poison, or fp32 parameter vectors); cudaMalloc'd so tests do not depend on
// the engine's allocator.
#pragma once

#include <cuda_runtime_api.h>

#include "harness/kernel_rows.h"

namespace td::kernels::test_rows {

// A device copy of a host buffer (Rows, including its poison, or fp32 params).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const void* host, size_t bytes) : bytes_(std::max<size_t>(bytes, 16)) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes_), cudaSuccess);
    // cudaMemcpy from pageable memory may return before the DMA lands; kernels
    // on non-blocking streams would not wait for it: wait here.
    if (host && bytes) EXPECT_EQ(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    if (host && bytes) EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  explicit DeviceBuffer(const Rows& r) : DeviceBuffer(r.bytes.data(), r.bytes.size()) {}
  explicit DeviceBuffer(const std::vector<float>& v) : DeviceBuffer(v.data(), v.size() * 4) {}
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // The device address of host.data() (the first row, past host.offset) in this copy of `host`.
  void* at(const Rows& host) const {
    return static_cast<unsigned char*>(ptr_) + host.offset * int64_t(elem_size(host.type));
  }
  float* f32() const { return static_cast<float*>(ptr_); }
  // Copies the device buffer back into `host` (same layout).
  void download(Rows& host) const {
    ASSERT_EQ(cudaMemcpy(host.bytes.data(), ptr_, host.bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace td::kernels::test_rows
