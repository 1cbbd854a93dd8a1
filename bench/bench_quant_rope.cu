// Benchmark of the INT8 quantizers, the fused LayerNorm + AdaLN + quantize
// kernels and the fused q/k RMSNorm + 3-D RoPE, at Wan's shapes:
//   wan13_480p: 32760 tokens x 1536 (grid 21 x 30 x 52, 12 heads x 128)
//   wan14_720p: 75600 tokens x 5120 (grid 21 x 45 x 80, 40 heads x 128)
// bf16 activations. For each op: the median of CUDA-event timings after
// warm-up (inputs rotated through copies when smaller than 2x L2), the bytes
// an ideal kernel moves (each input read once, each output written once), the
// achieved bandwidth, its fraction of the device-to-device copy bandwidth
// measured in the same run, and the prediction bytes / 4.0 TB/s.
// bench/torch_quant_rope.py prints the eager PyTorch timings under the same keys.
// One JSON object on stdout.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/quant/layernorm_modulate_quant.h"
#include "kernels/quant/quant_block128.h"
#include "kernels/quant/quant_per_row.h"
#include "kernels/quant/quant_token128.h"
#include "kernels/rope/qk_norm_rope.h"

namespace {

using namespace td::kernels;
using td::bench::Timing;

constexpr double kPredictTBps = 4.0;

struct Shape {
  const char* name;
  int64_t tokens, dim, frames, height, width;
  int heads, head_dim;
};
constexpr Shape kShapes[] = {{"wan13_480p", 32760, 1536, 21, 30, 52, 12, 128},
                             {"wan14_720p", 75600, 5120, 21, 45, 80, 40, 128}};

void check(Status s, const char* what) {
  if (s != Status::Ok) {
    std::fprintf(stderr, "bench_quant_rope: %s returned %s\n", what, status_str(s));
    std::exit(1);
  }
}

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  TD_BENCH_CUDA(cudaMalloc(&p, bytes));
  return p;
}

nlohmann::json result(const Timing& t, double bytes, double copy_gbps, cudaStream_t stream) {
  const double gbps = bytes / (t.median_ms * 1e-3) / 1e9;
  return {{"median_ms", t.median_ms},
          {"min_ms", t.min_ms},
          {"bytes", bytes},
          {"gbps", gbps},
          {"fraction_of_copy", gbps / copy_gbps},
          {"fraction_of_copy_same_traffic", gbps / td::bench::copy_bandwidth_same_traffic_gbps(bytes, stream)},
          {"predicted_ms", bytes / (kPredictTBps * 1e12) * 1e3}};
}

nlohmann::json bench_shape(const Shape& s, cudaStream_t stream) {
  const int64_t M = s.tokens, K = s.dim, groups = quant_groups(K), row_blocks = quant_groups(M);
  const size_t elems = size_t(M * K);
  const size_t x_bytes = elems * 2;
  const int copies = td::bench::rotation_count(x_bytes);

  // Inputs: `copies` bf16 activation tensors (q and k for RoPE reuse the same pool).
  std::vector<void*> x(static_cast<size_t>(copies)), k(static_cast<size_t>(copies));
  for (int i = 0; i < copies; ++i) {
    x[size_t(i)] = dev_alloc(x_bytes);
    k[size_t(i)] = dev_alloc(x_bytes);
    td::bench::fill_random_bf16(x[size_t(i)], elems, 1.f, 17u + unsigned(i), stream);
    td::bench::fill_random_bf16(k[size_t(i)], elems, 1.f, 71u + unsigned(i), stream);
  }
  auto* q8 = static_cast<int8_t*>(dev_alloc(elems));
  auto* scales = static_cast<float*>(dev_alloc(size_t(groups * M + row_blocks * groups) * 4));
  auto* e0 = static_cast<float*>(dev_alloc(size_t(6 * K) * 4));  // Wan's [1, 6, dim] modulation
  td::bench::fill_random_f32(e0, size_t(6 * K), 0.3f, 5u, stream);
  auto* weights = static_cast<float*>(dev_alloc(size_t(2 * K) * 4));
  td::bench::fill_random_f32(weights, size_t(2 * K), 1.f, 9u, stream);
  void* q_out = dev_alloc(x_bytes);
  void* k_out = dev_alloc(x_bytes);
  const RopeTableLayout tl = rope_table_layout(s.head_dim, s.frames, s.height, s.width);
  std::vector<float> tables_host(size_t(tl.total));
  check(rope_tables_cpu(s.head_dim, s.frames, s.height, s.width, 10000.0, tables_host.data()), "rope_tables_cpu");
  auto* tables = static_cast<float*>(dev_alloc(tables_host.size() * 4));
  TD_BENCH_CUDA(cudaMemcpy(tables, tables_host.data(), tables_host.size() * 4, cudaMemcpyHostToDevice));
  TD_BENCH_CUDA(cudaDeviceSynchronize());  // pageable H2D may return before its DMA lands
  TD_BENCH_CUDA(cudaStreamSynchronize(stream));

  const double copy_gbps = td::bench::copy_bandwidth_gbps(x_bytes, stream);
  const double quant_bytes = double(elems) * 3;  // bf16 in, int8 out
  nlohmann::json ops;
  auto xi = [&](int i) { return x[size_t(i % copies)]; };
  auto ki = [&](int i) { return k[size_t(i % copies)]; };

  ops["quant_block128"] = result(
      td::bench::time_cuda([&](int i) {
        check(quantize_block128_cuda(ElemType::BF16, xi(i), M, K, K, q8, K, scales, stream), "quantize_block128_cuda");
      }, stream),
      quant_bytes + 4.0 * double(row_blocks * groups), copy_gbps, stream);
  // quant_token128: Items4 (the first kernel); _items8 / _items4_idx32 /
  // _items4_idx32_lane: the variants; _slabs: RowSlabs, Auto's choice.
  for (Token128QuantKernel v :
       {Token128QuantKernel::Items4, Token128QuantKernel::Items8Idx32, Token128QuantKernel::Items4Idx32,
        Token128QuantKernel::Items4Idx32Lane, Token128QuantKernel::RowSlabs})
    ops[v == Token128QuantKernel::Items4            ? "quant_token128"
        : v == Token128QuantKernel::Items8Idx32     ? "quant_token128_items8"
        : v == Token128QuantKernel::Items4Idx32     ? "quant_token128_items4_idx32"
        : v == Token128QuantKernel::Items4Idx32Lane ? "quant_token128_items4_idx32_lane"
                                                    : "quant_token128_slabs"] = result(
        td::bench::time_cuda([&](int i) {
          check(quantize_token128_cuda(ElemType::BF16, xi(i), M, K, K, q8, K, scales, M, stream, v),
                "quantize_token128_cuda");
        }, stream),
        quant_bytes + 4.0 * double(groups * M), copy_gbps, stream);
  ops["quant_per_row"] = result(
      td::bench::time_cuda([&](int i) {
        check(quantize_per_row_cuda(ElemType::BF16, xi(i), M, K, K, q8, K, scales, stream), "quantize_per_row_cuda");
      }, stream),
      quant_bytes + 4.0 * double(M), copy_gbps, stream);
  // Every token128 variant side by side: ln_mod_quant_token128 is the
  // one-row kernel, _warps / _warps_lean / _pairs / _pairs_reload the
  // LnQuantTokenRows variants (_pairs_reload: Auto since session 5 where it
  // takes the rows; elsewhere _warps_lean up to 2048, the one-row kernel
  // above). _warps (WarpRows: a row per warp, bit-identical to the default),
  // predicted from ~16 (1536) / ~19.5 (5120) instructions per element (SASS)
  // against ~34.6 measured for the default: 88-93% / 85-92% of copy;
  // measured 66-67% / 57%. _warps_lean (28 warps per SM; 1536 only, 5120
  // runs _warps): predicted 90-95% at 1536, measured 67.6%. (_rows2, _rows4,
  // _teams and _warps_pf measured slower and were removed.)
  // _pairs (PairRows: a team owns two rows, the fp32 shift/scale read once
  // for both in whole 128-byte lines; not bit-identical): predicted 85-93%
  // of copy at 32760x1536 and 82-92% at 75600x5120 (measured on the H200
  // 2026-11-30: 73.5% / 61.8%, latency-bound at 16 warps per SM).
  // _pairs_reload (x blocks loaded again for y, 80 registers, 24 warps per
  // SM): predicted 82-90% / 70-80%; measured 74.6% / 65.2%.
  for (LnQuantTokenRows v : {LnQuantTokenRows::One, LnQuantTokenRows::WarpRows, LnQuantTokenRows::WarpRowsLean,
                             LnQuantTokenRows::PairRows, LnQuantTokenRows::PairRowsReload, LnQuantTokenRows::Columns}) {
    const char* key = v == LnQuantTokenRows::One                ? "ln_mod_quant_token128"
                      : v == LnQuantTokenRows::WarpRows         ? "ln_mod_quant_token128_warps"
                      : v == LnQuantTokenRows::WarpRowsLean     ? "ln_mod_quant_token128_warps_lean"
                      : v == LnQuantTokenRows::PairRows         ? "ln_mod_quant_token128_pairs"
                      : v == LnQuantTokenRows::Columns          ? "ln_mod_quant_token128_columns"
                                                                : "ln_mod_quant_token128_pairs_reload";
    ops[key] = result(
        td::bench::time_cuda([&](int i) {
          check(layernorm_modulate_quant_token128_cuda(ElemType::BF16, xi(i), M, K, K, e0, e0 + K, 6 * K, M, 1e-6f,
                                                       q8, K, scales, M, stream, v),
                "layernorm_modulate_quant_token128_cuda");
        }, stream),
        quant_bytes + 4.0 * double(groups * M), copy_gbps, stream);
  }
  // block128: Auto with a workspace (RowStats: a row-statistics kernel,
  // then the block quantizer applying them), the portable kernel (one CTA
  // per stripe) and the cluster kernel, all against the ideal bytes (one
  // read of x).
  const size_t stats_bytes = layernorm_modulate_quant_block128_workspace_bytes(M);
  void* stats_work = nullptr;
  TD_BENCH_CUDA(cudaMalloc(&stats_work, stats_bytes));
  // _cluster: LnQuantBlockPath::Cluster (sm_90+ only: persistent clusters, x read once).
  int cc_major = 0, dev = 0;
  TD_BENCH_CUDA(cudaGetDevice(&dev));
  TD_BENCH_CUDA(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev));
  for (LnQuantBlockPath path : {LnQuantBlockPath::Auto, LnQuantBlockPath::Portable, LnQuantBlockPath::Cluster}) {
    if (path == LnQuantBlockPath::Cluster && cc_major < 9) continue;
    ops[path == LnQuantBlockPath::Auto       ? "ln_mod_quant_block128"
        : path == LnQuantBlockPath::Portable ? "ln_mod_quant_block128_portable"
                                             : "ln_mod_quant_block128_cluster"] = result(
        td::bench::time_cuda([&](int i) {
          check(layernorm_modulate_quant_block128_cuda(ElemType::BF16, xi(i), M, K, K, e0, e0 + K, 6 * K, M, 1e-6f,
                                                       q8, K, scales, path, stream, stats_work, stats_bytes),
                "layernorm_modulate_quant_block128_cuda");
        }, stream),
        quant_bytes + 4.0 * double(row_blocks * groups), copy_gbps, stream);
  }
  cudaFree(stats_work);
  const double rope_bytes = 2.0 * double(elems) * 4;  // q and k: bf16 in + bf16 out
  // Every kernel variant side by side: qk_norm_rope_<layout> is GlobalTables,
  // qk_norm_rope_<layout>_shared is SharedAngles (Auto's choice).
  for (RopeOutLayout layout : {RopeOutLayout::BLHD, RopeOutLayout::BHLD})
    for (QkRopeKernel kernel :
         {QkRopeKernel::GlobalTables, QkRopeKernel::SharedAngles, QkRopeKernel::SharedAnglesWarpRows}) {
      std::string key = layout == RopeOutLayout::BLHD ? "qk_norm_rope_blhd" : "qk_norm_rope_bhld";
      if (kernel == QkRopeKernel::SharedAngles) key += "_shared";
      if (kernel == QkRopeKernel::SharedAnglesWarpRows) key += "_shared_warps";
      ops[key] = result(
          td::bench::time_cuda([&](int i) {
            check(qk_norm_rope_cuda(ElemType::BF16, xi(i), K, ki(i), K, weights, weights + K, 1, s.frames, s.height,
                                    s.width, s.heads, s.head_dim, 1e-6f, tables, layout, ElemType::BF16, q_out,
                                    k_out, stream, kernel),
                  "qk_norm_rope_cuda");
          }, stream),
          rope_bytes, copy_gbps, stream);
    }

  for (int i = 0; i < copies; ++i) cudaFree(x[size_t(i)]), cudaFree(k[size_t(i)]);
  cudaFree(q8), cudaFree(scales), cudaFree(e0), cudaFree(weights), cudaFree(q_out), cudaFree(k_out), cudaFree(tables);
  return {{"tokens", M}, {"dim", K}, {"heads", s.heads}, {"head_dim", s.head_dim},
          {"grid", {s.frames, s.height, s.width}}, {"copy_gbps", copy_gbps}, {"input_copies", copies}, {"ops", ops}};
}

}  // namespace

int main() {
  cudaStream_t stream;
  TD_BENCH_CUDA(cudaStreamCreate(&stream));
  nlohmann::json out;
  out["bench"] = "quant_rope";
  out["device"] = td::bench::device_json();
  out["dtype"] = "bf16";
  out["predicted_at_tbps"] = kPredictTBps;
  for (const Shape& s : kShapes) out["shapes"][s.name] = bench_shape(s, stream);
  TD_BENCH_CUDA(cudaStreamDestroy(stream));
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}
