// Benchmark of the fused LayerNorm + AdaLN modulation + INT8 block128
// quantization (issue 3's bar: >= 90% of the device copy bandwidth), every
// CUDA path side by side at Wan's shapes, bf16 x, fp32 shift/scale rows of
// Wan's e0 [1, 6, dim] (ld_mod = 6 * dim):
//   wan13_480p: 32760 tokens x 1536;  wan14_720p: 75600 tokens x 5120.
// Keys (as bench_quant_rope's, plus the new ones):
//   ln_mod_quant_block128            Auto (the default dispatch)
//   ln_mod_quant_block128_portable   two reads of x, one CTA per stripe
//   ln_mod_quant_block128_cluster    8-16 CTAs x 8-16 rows, DSMEM maxima
//   ln_mod_quant_block128_stream     layernorm_modulate_quant_block128_stream.h,
//                                    the chooser's split (plan in "plan")
//   ln_mod_quant_block128_stream_<r>x<c>  the same kernel, split forced to r
//                                    row parts x c column parts
// For each: the median of CUDA-event timings after warm-up (inputs rotated
// through copies larger than 2x L2), the ideal bytes (x read once, codes
// written once, the scales), the achieved bandwidth, its fraction of the
// device-to-device copy measured in the same run, and the prediction at
// 4.0 TB/s. One JSON object on stdout.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/quant/layernorm_modulate_quant.h"
#include "kernels/quant/layernorm_modulate_quant_block128_stream.h"

namespace {

using namespace td::kernels;
using td::bench::Timing;

constexpr double kPredictTBps = 4.0;

struct Shape {
  const char* name;
  int64_t tokens, dim;
};
constexpr Shape kShapes[] = {{"wan13_480p", 32760, 1536}, {"wan14_720p", 75600, 5120}};

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  TD_BENCH_CUDA(cudaMalloc(&p, bytes));
  return p;
}

nlohmann::json result(const Timing& t, double bytes, double copy_gbps) {
  const double gbps = bytes / (t.median_ms * 1e-3) / 1e9;
  return {{"median_ms", t.median_ms},
          {"min_ms", t.min_ms},
          {"max_ms", t.max_ms},
          {"bytes", bytes},
          {"gbps", gbps},
          {"fraction_of_copy", gbps / copy_gbps},
          {"predicted_ms", bytes / (kPredictTBps * 1e12) * 1e3}};
}

nlohmann::json plan_json(const LnQuantStreamPlan& p) {
  return {{"row_parts", p.row_parts},         {"col_parts", p.col_parts}, {"slab_cols", p.slab_cols},
          {"rows_per_warp", p.rows_per_warp}, {"slots", p.slots},         {"ring_chunks", p.ring_chunks},
          {"clusters", p.clusters}};
}

nlohmann::json bench_shape(const Shape& s, cudaStream_t stream) {
  const int64_t M = s.tokens, K = s.dim, groups = quant_groups(K), row_blocks = quant_groups(M);
  const size_t elems = size_t(M * K);
  const size_t x_bytes = elems * 2;
  const int copies = td::bench::rotation_count(x_bytes);
  std::vector<void*> x(static_cast<size_t>(copies));
  for (int i = 0; i < copies; ++i) {
    x[size_t(i)] = dev_alloc(x_bytes);
    td::bench::fill_random_bf16(x[size_t(i)], elems, 1.f, 17u + unsigned(i), stream);
  }
  auto* q8 = static_cast<int8_t*>(dev_alloc(elems));
  auto* scales = static_cast<float*>(dev_alloc(size_t(row_blocks * groups) * 4));
  auto* e0 = static_cast<float*>(dev_alloc(size_t(6 * K) * 4));
  td::bench::fill_random_f32(e0, size_t(6 * K), 0.3f, 5u, stream);
  TD_BENCH_CUDA(cudaStreamSynchronize(stream));

  const double copy_gbps = td::bench::copy_bandwidth_gbps(x_bytes, stream);
  const double bytes = double(elems) * 3 + 4.0 * double(row_blocks * groups);
  auto xi = [&](int i) { return x[size_t(i % copies)]; };
  nlohmann::json ops, skipped;

  // Times fn if a probe call returns Ok (a path may be Unsupported here).
  auto time_path = [&](const std::string& key, auto fn) {
    const Status st = fn(0);
    if (st != Status::Ok) {
      skipped[key] = status_str(st);
      (void)cudaGetLastError();
      return;
    }
    TD_BENCH_CUDA(cudaStreamSynchronize(stream));
    ops[key] = result(td::bench::time_cuda([&](int i) { (void)fn(i); }, stream), bytes, copy_gbps);
  };
  for (LnQuantBlockPath path : {LnQuantBlockPath::Auto, LnQuantBlockPath::Portable, LnQuantBlockPath::Cluster}) {
    const char* key = path == LnQuantBlockPath::Auto       ? "ln_mod_quant_block128"
                      : path == LnQuantBlockPath::Portable ? "ln_mod_quant_block128_portable"
                                                           : "ln_mod_quant_block128_cluster";
    time_path(key, [&](int i) {
      return layernorm_modulate_quant_block128_cuda(ElemType::BF16, xi(i), M, K, K, e0, e0 + K, 6 * K, M, 1e-6f, q8,
                                                    K, scales, path, stream);
    });
  }
  nlohmann::json plans;
  auto stream_path = [&](const std::string& key, LnQuantStreamOptions opt) {
    LnQuantStreamPlan plan;
    if (layernorm_modulate_quant_block128_stream_plan(ElemType::BF16, K, opt, &plan) == Status::Ok)
      plans[key] = plan_json(plan);
    time_path(key, [&](int i) {
      return layernorm_modulate_quant_block128_stream_cuda(ElemType::BF16, xi(i), M, K, K, e0, e0 + K, 6 * K, M,
                                                           1e-6f, q8, K, scales, stream, opt);
    });
  };
  stream_path("ln_mod_quant_block128_stream", {});
  // The other splits worth comparing at this width.
  const LnQuantStreamOptions forced[] = {{1, 2}, {1, 3}, {1, 4}, {1, 6}, {2, 2}, {2, 3}, {2, 4}, {1, 8}, {2, 8}};
  for (const LnQuantStreamOptions& o : forced) {
    LnQuantStreamPlan plan;
    if (layernorm_modulate_quant_block128_stream_plan(ElemType::BF16, K, o, &plan) != Status::Ok) continue;
    stream_path("ln_mod_quant_block128_stream_" + std::to_string(o.row_parts) + "x" + std::to_string(o.col_parts), o);
  }

  for (int i = 0; i < copies; ++i) cudaFree(x[size_t(i)]);
  cudaFree(q8), cudaFree(scales), cudaFree(e0);
  return {{"tokens", M},        {"dim", K},      {"copy_gbps", copy_gbps}, {"input_copies", copies},
          {"ops", ops},         {"plans", plans}, {"skipped", skipped}};
}

}  // namespace

int main() {
  cudaStream_t stream;
  TD_BENCH_CUDA(cudaStreamCreate(&stream));
  nlohmann::json out;
  out["bench"] = "ln_quant_block128";
  out["device"] = td::bench::device_json();
  out["dtype"] = "bf16";
  out["predicted_at_tbps"] = kPredictTBps;
  for (const Shape& s : kShapes) out["shapes"][s.name] = bench_shape(s, stream);
  TD_BENCH_CUDA(cudaStreamDestroy(stream));
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}
