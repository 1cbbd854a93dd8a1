// The CUDA runtime as the rest of turbodiff sees it. Compiled against cudart
// when the build has CUDA (cuda_runtime.cpp), otherwise every call that needs
// a GPU throws a clear Unsupported error (cuda_runtime_none.cpp), and
// device_count() is 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace td::cuda {

// True when this binary was built with CUDA kernels.
bool built_with_cuda();
// Number of usable CUDA devices; 0 when built without CUDA or no driver/GPU.
int device_count();
// Why device_count() is 0 ("no CUDA driver", "built without CUDA", ...); empty when > 0.
std::string unavailable_reason();

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  size_t total_memory = 0, free_memory = 0;
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;
};
DeviceInfo device_info(int device);
int driver_version();   // e.g. 13000; 0 if none
int runtime_version();  // cudart this binary was linked with

void set_device(int device);

// The stream ops launch on unless told otherwise: the per-thread default
// stream (cudaStreamPerThread), the same one the allocator orders on. nullptr
// without CUDA.
void* current_stream();

// Stream-ordered allocation from the device's memory pool (freed memory stays
// cached in the pool). Throws OutOfMemory with the request and free memory.
void* device_alloc(size_t nbytes, int device);
void device_free(void* p, int device);
// Bytes currently allocated through device_alloc, and the peak since reset.
size_t allocated_bytes(int device);
size_t peak_allocated_bytes(int device);
void reset_peak(int device);

void memset_zero(void* p, size_t nbytes, int device);
// Host<->device copy, synchronous. to_device selects the direction.
void memcpy_sync(void* dst, const void* src, size_t nbytes, bool to_device);
void memcpy_d2d(void* dst, const void* src, size_t nbytes, int device);
void synchronize(int device);

// Throws td::Error(Cuda) naming `what` when the last kernel launch failed.
void check_last_launch(const char* what);

// RAII CUDA stream and event. Stream::native() is a cudaStream_t as void*.
class Stream {
 public:
  explicit Stream(int device = 0);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* native() const { return stream_; }
  void synchronize() const;
  int device() const { return device_; }

 private:
  void* stream_ = nullptr;
  int device_ = 0;
};

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(void* stream);
  void synchronize() const;
  // Milliseconds between two recorded events.
  static float elapsed_ms(const Event& start, const Event& end);
  void* native() const { return event_; }

 private:
  void* event_ = nullptr;
};

}  // namespace td::cuda
