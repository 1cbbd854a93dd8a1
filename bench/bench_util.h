// Benchmark harness shared by bench_*.cu/.cpp: CUDA-event timing after warm-up,
// the median of many runs, input rotation across buffers larger than L2, the
// device-copy ceiling measured in the same run, and JSON output on stdout.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace td::bench {

#define TD_BENCH_CUDA(call)                                                                  \
  do {                                                                                       \
    cudaError_t _e = (call);                                                                 \
    if (_e != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(_e)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int runs = 0;
};

// Times fn(i) (i = run index, use it to rotate among input sets) on `stream`:
// `warmup` untimed runs, then `reps` runs each between two CUDA events.
inline Timing time_cuda(const std::function<void(int)>& fn, cudaStream_t stream, int warmup = 10, int reps = 50) {
  for (int i = 0; i < warmup; ++i) fn(i);
  TD_BENCH_CUDA(cudaStreamSynchronize(stream));
  TD_BENCH_CUDA(cudaGetLastError());
  std::vector<cudaEvent_t> ev(size_t(reps) + 1);
  for (auto& e : ev) TD_BENCH_CUDA(cudaEventCreate(&e));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    TD_BENCH_CUDA(cudaEventRecord(ev[size_t(i)], stream));
    fn(warmup + i);
    TD_BENCH_CUDA(cudaEventRecord(ev[size_t(i) + 1], stream));
    // separate event pairs: each run timed on its own
    TD_BENCH_CUDA(cudaEventSynchronize(ev[size_t(i) + 1]));
    TD_BENCH_CUDA(cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(i)], ev[size_t(i) + 1]));
  }
  TD_BENCH_CUDA(cudaGetLastError());
  for (auto& e : ev) cudaEventDestroy(e);
  std::vector<float> s = ms;
  std::sort(s.begin(), s.end());
  Timing t;
  t.runs = reps;
  t.median_ms = s[s.size() / 2];
  t.min_ms = s.front();
  t.max_ms = s.back();
  return t;
}

// How many copies of a working set of `bytes` to rotate through so that the
// total exceeds twice the L2 (each run then reads from HBM, not cache).
inline int rotation_count(size_t bytes) {
  int dev = 0;
  cudaGetDevice(&dev);
  int l2 = 0;
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
  const size_t need = 2 * size_t(l2);
  return int(std::min<size_t>(8, std::max<size_t>(1, (need + bytes - 1) / std::max<size_t>(bytes, 1))));
}

// Device-to-device copy bandwidth (bytes read + written per second) of a
// `bytes`-sized buffer: the ceiling memory-bound kernels are measured against.
inline double copy_bandwidth_gbps(size_t bytes, cudaStream_t stream) {
  void *a = nullptr, *b = nullptr;
  TD_BENCH_CUDA(cudaMalloc(&a, bytes));
  TD_BENCH_CUDA(cudaMalloc(&b, bytes));
  TD_BENCH_CUDA(cudaMemsetAsync(a, 1, bytes, stream));
  Timing t = time_cuda([&](int) { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream); }, stream);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (t.median_ms * 1e-3) / 1e9;
}

// Device-to-device copy bandwidth for a kernel that moves `traffic` bytes
// (read + written): a copy of traffic / 2 bytes, the same traffic (cached per
// size). Why beside copy_bandwidth_gbps: at Wan-1.3B's 32760 x 1536 bf16
// (100 MB each way) a copy of twice the bytes, bench_norm's first reference,
// runs 7% faster than a copy of the tensor itself (3.96 against 3.68 TB/s:
// launch, ramp and tail spread over twice the time), while plain copy kernels
// match the same-size copy (99-101%; H200, 2026-11-30, bench_bandwidth).
inline double copy_bandwidth_same_traffic_gbps(double traffic, cudaStream_t stream) {
  static std::vector<std::pair<size_t, double>> cache;
  const size_t bytes = std::max<size_t>(256, size_t(traffic / 2) / 256 * 256);
  for (const auto& [b, g] : cache)
    if (b == bytes) return g;
  const double g = copy_bandwidth_gbps(bytes, stream);
  cache.emplace_back(bytes, g);
  return g;
}

inline nlohmann::json device_json() {
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, dev);
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  return {{"name", p.name}, {"cc", std::to_string(p.major) + "." + std::to_string(p.minor)},
          {"sms", p.multiProcessorCount}, {"driver", drv}, {"runtime", rt}};
}

// Fills a device buffer with pseudo-random values of the given element size
// (never zeros: zeros make some kernels look faster than real data does).
void fill_random_bf16(void* dev_ptr, size_t n, float stddev, unsigned seed, cudaStream_t stream);
void fill_random_f32(void* dev_ptr, size_t n, float stddev, unsigned seed, cudaStream_t stream);

}  // namespace td::bench
