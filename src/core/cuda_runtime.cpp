// CUDA build of the runtime facade (see cuda_runtime.h).
#include "core/cuda_runtime.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "core/error.h"

namespace td::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    fail(ErrorKind::OutOfMemory, what, ": ", cudaGetErrorString(e));
  }
  fail(ErrorKind::Cuda, what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

constexpr int kMaxDevices = 64;
struct Counters {
  std::atomic<size_t> current{0}, peak{0};
};
Counters g_counters[kMaxDevices];
std::mutex g_sizes_mu;
std::unordered_map<void*, size_t> g_sizes;
std::once_flag g_pool_once[kMaxDevices];

}  // namespace

bool built_with_cuda() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string unavailable_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (e == cudaErrorInsufficientDriver) {
      // Tell "no driver at all" (a machine without a GPU) from "driver too old".
      if (void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
        dlclose(h);
        return cat("the NVIDIA driver is older than this build's CUDA runtime ", runtime_version() / 1000, ".",
                   (runtime_version() % 1000) / 10, " needs");
      }
      return "no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded)";
    }
    return cat("cudaGetDeviceCount failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  }
  if (n == 0) return "the CUDA driver reports no devices";
  return "";
}

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  DeviceInfo d;
  d.index = device;
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.total_memory = p.totalGlobalMem;
  d.sm_count = p.multiProcessorCount;
  d.l2_bytes = size_t(p.l2CacheSize);
  d.smem_per_block_optin = p.sharedMemPerBlockOptin;
  int prev = 0;
  cudaGetDevice(&prev);
  if (cudaSetDevice(device) == cudaSuccess) {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) == cudaSuccess) d.free_memory = f;
    else cudaGetLastError();
    cudaSetDevice(prev);
  }
  return d;
}

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return v;
}

int runtime_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return v;
}

void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

void* current_stream() { return static_cast<void*>(cudaStreamPerThread); }

void* device_alloc(size_t nbytes, int device) {
  TD_CHECK(device >= 0 && device < kMaxDevices, Usage, "CUDA device index ", device, " out of range");
  std::call_once(g_pool_once[device], [device] {
    // Keep freed blocks in the pool instead of returning them to the driver at each sync.
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      uint64_t threshold = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    }
    cudaGetLastError();
  });
  int prev = 0;
  check(cudaGetDevice(&prev), "cudaGetDevice");
  if (prev != device) check(cudaSetDevice(device), "cudaSetDevice");
  void* p = nullptr;
  cudaError_t e = cudaMallocAsync(&p, nbytes == 0 ? 1 : nbytes, cudaStreamPerThread);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    if (prev != device) cudaSetDevice(prev);
    if (e == cudaErrorMemoryAllocation)
      fail(ErrorKind::OutOfMemory, "out of GPU memory on cuda:", device, ": asked for ", nbytes, " bytes, ",
           f, " of ", t, " bytes free, ", allocated_bytes(device), " held by turbodiff");
    check(e, "cudaMallocAsync");
  }
  if (prev != device) cudaSetDevice(prev);
  {
    std::lock_guard<std::mutex> lk(g_sizes_mu);
    g_sizes[p] = nbytes;
  }
  size_t cur = g_counters[device].current.fetch_add(nbytes) + nbytes;
  size_t pk = g_counters[device].peak.load();
  while (cur > pk && !g_counters[device].peak.compare_exchange_weak(pk, cur)) {
  }
  return p;
}

void device_free(void* p, int device) {
  if (!p) return;
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lk(g_sizes_mu);
    auto it = g_sizes.find(p);
    if (it != g_sizes.end()) {
      n = it->second;
      g_sizes.erase(it);
    }
  }
  g_counters[device].current.fetch_sub(n);
  // Destructors must not throw: errors here (e.g. at process teardown) are dropped.
  if (cudaFreeAsync(p, cudaStreamPerThread) != cudaSuccess) cudaGetLastError();
}

size_t allocated_bytes(int device) { return g_counters[device].current.load(); }
size_t peak_allocated_bytes(int device) { return g_counters[device].peak.load(); }
void reset_peak(int device) { g_counters[device].peak.store(g_counters[device].current.load()); }

void memset_zero(void* p, size_t nbytes, int device) {
  (void)device;
  check(cudaMemsetAsync(p, 0, nbytes, cudaStreamPerThread), "cudaMemsetAsync");
  check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
}

void memcpy_sync(void* dst, const void* src, size_t nbytes, bool to_device) {
  // Ordered on the per-thread stream and waited for there: a plain cudaMemcpy
  // from pageable memory may return before its DMA has landed, and kernels on
  // a non-blocking stream do not wait for it (on the H200, under load, a test
  // kernel ran before its poisoned output buffer was uploaded and the poison
  // then overwrote its result).
  check(cudaMemcpyAsync(dst, src, nbytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                        cudaStreamPerThread),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
}

void memcpy_d2d(void* dst, const void* src, size_t nbytes, int device) {
  (void)device;
  check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, cudaStreamPerThread), "cudaMemcpyAsync");
}

void synchronize(int device) {
  int prev = 0;
  cudaGetDevice(&prev);
  if (prev != device) check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (prev != device) cudaSetDevice(prev);
}

void check_last_launch(const char* what) { check(cudaGetLastError(), what); }

Stream::Stream(int device) : device_(device) {
  set_device(device);
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
}
Stream::~Stream() {
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}
void Stream::synchronize() const {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize");
}

Event::Event() {
  cudaEvent_t e;
  check(cudaEventCreate(&e), "cudaEventCreate");
  event_ = e;
}
Event::~Event() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}
void Event::record(void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
}
void Event::synchronize() const {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)), "cudaEventSynchronize");
}
float Event::elapsed_ms(const Event& a, const Event& b) {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a.event_), static_cast<cudaEvent_t>(b.event_)),
        "cudaEventElapsedTime");
  return ms;
}

}  // namespace td::cuda
