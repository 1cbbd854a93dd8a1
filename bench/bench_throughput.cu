// The H200 ceilings the speed issues' kernels are judged against, measured
// rather than taken from a data sheet (device/METHOD.md: know the floor
// first). One JSON object:
//   - l2_read: the read bandwidth of a buffer that stays in L2 (4-32 MB, read
//     again and again by every SM, 16-byte ld.global.cg: L2, not L1) for 2 to
//     8 CTAs of 256 threads per SM, beside the same kernel on a 256 MB buffer
//     (HBM). The sparse sage kernel and the block-scaled GEMM pull their
//     operands from L2: this is their data-movement ceiling.
//   - conversions: results per SM per clock of the instructions the
//     quantizers and the GEMM's promotion spend per element: I2FP.F32.S32
//     (int32 -> fp32, Hopper's form of I2F), F2I.S8 (cvt.rni.sat.s8.f32, the
//     INT8 codes), FFMA, each in 8 independent chains per thread with a
//     cheap dependent op (IADD / FADD) between, so the loop measures the
//     unit's throughput, not its latency.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "bench_util.h"

namespace {

__global__ void l2_read_kernel(const uint4* __restrict__ p, int64_t n16, int passes, uint4* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int it = 0; it < passes; ++it)
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n16; i += stride) {
      uint4 v;
      asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(p + i));
      acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
    }
  if (acc.x == 0x9e3779b9u && acc.y == 0x7f4a7c15u) *sink = acc;  // never true for the memset pattern; keeps the loads
}

enum Op { kI2fp = 0, kF2iS8 = 1, kFfma = 2 };
constexpr int kChains = 8, kIters = 2048;

template <int kOp>
__global__ void convert_kernel(float* sink, int seed) {
  int a[kChains];
  float f[kChains];
#pragma unroll
  for (int j = 0; j < kChains; ++j) {
    a[j] = int(threadIdx.x) * 7 + j + seed;
    f[j] = float(a[j]) * 0.5f;
  }
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int j = 0; j < kChains; ++j) {
      if constexpr (kOp == kI2fp) {
        f[j] = __int2float_rn(a[j]);  // I2FP.F32.S32
        a[j] = __float_as_int(f[j]) + 3;
      } else if constexpr (kOp == kF2iS8) {
        int r;
        asm volatile("cvt.rni.sat.s8.f32 %0, %1;\n" : "=r"(r) : "f"(f[j]));  // F2I.S8
        f[j] = __int_as_float(r) + 1.5f;
      } else {
        f[j] = fmaf(f[j], 1.0001f, 0.5f);
      }
    }
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kChains; ++j) s += f[j] + float(a[j]);
  if (s == 1.2345f) *sink = s;
}

}  // namespace

int main() {
  cudaStream_t stream;
  TD_BENCH_CUDA(cudaStreamCreate(&stream));
  int dev = 0, sms = 0, clock_khz = 0;
  TD_BENCH_CUDA(cudaGetDevice(&dev));
  TD_BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TD_BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  nlohmann::json out;
  out["bench"] = "throughput";
  out["device"] = td::bench::device_json();
  out["max_sm_clock_mhz"] = clock_khz / 1000;
  void* sink = nullptr;
  TD_BENCH_CUDA(cudaMalloc(&sink, 64));

  // L2 (and, for 256 MB, HBM) read bandwidth: GB/s of bytes loaded.
  nlohmann::json l2;
  for (const size_t mb : {4, 8, 16, 32, 256}) {
    const size_t bytes = mb << 20;
    void* buf = nullptr;
    TD_BENCH_CUDA(cudaMalloc(&buf, bytes));
    TD_BENCH_CUDA(cudaMemsetAsync(buf, 1, bytes, stream));
    const int passes = mb >= 256 ? 2 : int(800 / mb);  // ~0.8 GB per launch
    for (const int per_sm : {2, 4, 8}) {
      const td::bench::Timing t = td::bench::time_cuda(
          [&](int) {
            l2_read_kernel<<<unsigned(sms * per_sm), 256, 0, stream>>>(static_cast<const uint4*>(buf),
                                                                        int64_t(bytes / 16), passes,
                                                                        static_cast<uint4*>(sink));
          },
          stream, 3, 15);
      const std::string key = std::to_string(mb) + "MB_" + std::to_string(per_sm) + "x256_per_sm";
      l2[key] = {{"median_ms", t.median_ms},
                 {"gbps", double(bytes) * passes / (t.median_ms * 1e-3) / 1e9}};
    }
    cudaFree(buf);
  }
  out["l2_read"] = l2;

  // Conversion / FMA throughput, results per SM per clock at the maximum SM clock.
  nlohmann::json conv;
  auto run = [&](const char* name, void (*kernel)(float*, int)) {
    const int threads = 1024, grid = sms * 2;
    const td::bench::Timing t = td::bench::time_cuda(
        [&](int i) { kernel<<<unsigned(grid), threads, 0, stream>>>(static_cast<float*>(sink), i); }, stream, 3, 15);
    const double results = double(kIters) * kChains * threads * grid;
    const double per_sm_ns = results / (t.median_ms * 1e-3) / sms / 1e9;
    conv[name] = {{"median_ms", t.median_ms},
                  {"per_sm_per_ns", per_sm_ns},
                  {"per_sm_per_clock_at_max_clock", per_sm_ns / (clock_khz * 1e-6)}};
  };
  run("i2fp_f32_s32", convert_kernel<kI2fp>);
  run("f2i_s8_rni_sat", convert_kernel<kF2iS8>);
  run("ffma", convert_kernel<kFfma>);
  out["conversions"] = conv;
  out["note"] =
      "conversions: each result also runs one dependent IADD (I2FP) or FADD (F2I) in the same chain; FFMA alone";
  std::printf("%s\n", out.dump(2).c_str());
  cudaFree(sink);
  cudaStreamDestroy(stream);
  return 0;
}
