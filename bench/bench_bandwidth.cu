// What a memory-bound kernel can reach at Wan's activation shapes (issue 3's
// bar is a fraction of the device-copy bandwidth): cudaMemcpyAsync at the
// kernel's own byte count and at twice it (bench_norm's reference copies an
// fp32-sized tensor), and plain bf16 copy kernels of several shapes (one
// 16-byte load per thread; four per thread, loads first; a grid-stride loop
// over a persistent grid; a warp per row, the norms' layout at 1536, in
// 32-thread and 128-thread CTAs). Inputs rotate among copies past L2 as in
// bench_norm. Bandwidth = bytes read + written per second. One JSON object.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"

namespace {

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  TD_BENCH_CUDA(cudaMalloc(&p, bytes));
  return p;
}

__global__ void copy_vec16(const uint4* __restrict__ x, uint4* __restrict__ y, int64_t n16) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n16) y[i] = x[i];
}

// Four 16-byte loads per thread (strided by the CTA size: coalesced), then four stores.
__global__ void copy_vec16x4(const uint4* __restrict__ x, uint4* __restrict__ y, int64_t n16) {
  const int64_t base = int64_t(blockIdx.x) * blockDim.x * 4 + threadIdx.x;
  uint4 v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = base + int64_t(k) * blockDim.x;
    if (i < n16) v[k] = x[i];
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = base + int64_t(k) * blockDim.x;
    if (i < n16) y[i] = v[k];
  }
}

__global__ void copy_gridstride(const uint4* __restrict__ x, uint4* __restrict__ y, int64_t n16) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = x[i + k * stride];
#pragma unroll
    for (int k = 0; k < 4; ++k) y[i + k * stride] = v[k];
  }
  for (; i < n16; i += stride) y[i] = x[i];
}

// A warp per row of `packs` 16-byte packs (lane l: packs l, l + 32, ...): the
// layout of the norm kernels at 1536 (6 packs a lane), all loads first.
template <int kPerLane>
__global__ void copy_warp_rows(const uint4* __restrict__ x, uint4* __restrict__ y, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const uint4* xr = x + row * (32 * kPerLane);
  uint4* yr = y + row * (32 * kPerLane);
  uint4 v[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) v[k] = xr[lane + 32 * k];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) yr[lane + 32 * k] = v[k];
}

struct Shape {
  const char* name;
  int64_t rows, dim;
};

nlohmann::json bench_shape(const Shape& s, cudaStream_t stream, int sms) {
  const size_t bytes = size_t(s.rows * s.dim) * 2;  // bf16
  const int64_t n16 = int64_t(bytes / 16);
  const int copies = td::bench::rotation_count(bytes * 2);
  std::vector<void*> x(static_cast<size_t>(copies)), y(static_cast<size_t>(copies));
  for (int i = 0; i < copies; ++i) {
    x[size_t(i)] = device_alloc(bytes);
    y[size_t(i)] = device_alloc(bytes);
    TD_BENCH_CUDA(cudaMemsetAsync(x[size_t(i)], 1, bytes, stream));
  }
  TD_BENCH_CUDA(cudaStreamSynchronize(stream));
  auto xi = [&](int i) { return static_cast<const uint4*>(x[size_t(i % copies)]); };
  auto yi = [&](int i) { return static_cast<uint4*>(y[size_t(i % copies)]); };
  nlohmann::json ops;
  const double traffic = 2.0 * double(bytes);
  auto rec = [&](const char* name, const td::bench::Timing& t, double moved) {
    ops[name] = {{"median_ms", t.median_ms}, {"min_ms", t.min_ms}, {"gbps", moved / (t.median_ms * 1e-3) / 1e9}};
  };
  rec("memcpy_same_bytes_rotating",
      td::bench::time_cuda([&](int i) { cudaMemcpyAsync(yi(i), xi(i), bytes, cudaMemcpyDeviceToDevice, stream); },
                           stream),
      traffic);
  rec("memcpy_same_bytes_one_buffer",
      td::bench::time_cuda([&](int) { cudaMemcpyAsync(yi(0), xi(0), bytes, cudaMemcpyDeviceToDevice, stream); },
                           stream),
      traffic);
  ops["memcpy_twice_bytes_gbps"] = td::bench::copy_bandwidth_gbps(bytes * 2, stream);  // bench_norm's reference
  rec("copy_vec16", td::bench::time_cuda([&](int i) {
        copy_vec16<<<unsigned((n16 + 255) / 256), 256, 0, stream>>>(xi(i), yi(i), n16);
      }, stream), traffic);
  rec("copy_vec16x4", td::bench::time_cuda([&](int i) {
        copy_vec16x4<<<unsigned((n16 + 1023) / 1024), 256, 0, stream>>>(xi(i), yi(i), n16);
      }, stream), traffic);
  for (int per_sm : {4, 8, 16}) {
    const std::string name = "copy_gridstride_" + std::to_string(per_sm) + "x256_per_sm";
    rec(name.c_str(), td::bench::time_cuda([&](int i) {
          copy_gridstride<<<unsigned(sms * per_sm), 256, 0, stream>>>(xi(i), yi(i), n16);
        }, stream), traffic);
  }
  if (s.dim == 1536) {
    const int64_t rows = s.rows;
    rec("copy_warp_rows_cta32", td::bench::time_cuda([&](int i) {
          copy_warp_rows<6><<<unsigned(rows), 32, 0, stream>>>(xi(i), yi(i), rows);
        }, stream), traffic);
    rec("copy_warp_rows_cta128", td::bench::time_cuda([&](int i) {
          copy_warp_rows<6><<<unsigned((rows + 3) / 4), 128, 0, stream>>>(xi(i), yi(i), rows);
        }, stream), traffic);
    rec("copy_warp_rows_cta256", td::bench::time_cuda([&](int i) {
          copy_warp_rows<6><<<unsigned((rows + 7) / 8), 256, 0, stream>>>(xi(i), yi(i), rows);
        }, stream), traffic);
  } else if (s.dim == 5120) {
    const int64_t rows = s.rows;
    rec("copy_warp_rows_cta128", td::bench::time_cuda([&](int i) {
          copy_warp_rows<20><<<unsigned((rows + 3) / 4), 128, 0, stream>>>(xi(i), yi(i), rows);
        }, stream), traffic);
  }
  for (int i = 0; i < copies; ++i) cudaFree(x[size_t(i)]), cudaFree(y[size_t(i)]);
  return {{"rows", s.rows}, {"dim", s.dim}, {"bytes_each_way", bytes}, {"input_copies", copies}, {"ops", ops}};
}

}  // namespace

int main() {
  cudaStream_t stream;
  TD_BENCH_CUDA(cudaStreamCreate(&stream));
  int dev = 0, sms = 0;
  TD_BENCH_CUDA(cudaGetDevice(&dev));
  TD_BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  nlohmann::json out;
  out["bench"] = "bandwidth";
  out["device"] = td::bench::device_json();
  for (const Shape& s : {Shape{"wan13_480p", 32760, 1536}, Shape{"wan14_720p", 75600, 5120}})
    out["shapes"][s.name] = bench_shape(s, stream, sms);
  std::printf("%s\n", out.dump(2).c_str());
  cudaStreamDestroy(stream);
  return 0;
}
