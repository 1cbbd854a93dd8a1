// SLA / SageSLA on Wan's shapes (issue 6) against cuDNN dense SDPA in the same
// process: B = 1, head_dim 128, (L, H) = (32760, 12) and (75600, 40), topk
// 0.05 / 0.1 / 0.15 / 0.2. Each stage timed on its own (block selection, sparse
// kernel, linear branch with proj_l) and everything together (`sla_total`:
// kernels::sla_cuda; `sagesla_total`: selection with 64 x 128 blocks, the
// SageAttention-style kernel with its quantization passes, linear branch).
// The sparse kernels' dense-equivalent throughput is 4·B·H·L²·D / time.
// CUDA events after warm-up, medians; inputs (>= 300 MB) exceed L2.
// Block selection's top-k in both variants side by side: `*_select` / `*_total`
// with the bitonic sort (the default), `*_select_radix` / `*_total_radix` with
// the radix select (SlaTopkAlgo::Radix; the same LUT); `sagesla_total_overlap` /
// `sagesla_total_radix_overlap` with the linear branch's K/V half
// (`sagesla_linear_prepare`) on a second stream beside selection and the
// sparse kernel, its Q half (`sagesla_linear_apply`) after.
// Issue 6's overhead variants, in the same run beside the keys above:
//   `sla_select_tiled`, `sagesla_select_tiled`: selection with the Tiled score
//     GEMM (SlaScoreKernel::Tiled, radix top-k; the same LUT as `*_select_radix`);
//     `sla_total_tiled`: kernels::sla_cuda with it.
//   SageSLA's fused path (SlaOptions::fused / TD_SLA_FUSED=1), stage by stage:
//     `sagesla_prepass` (today's sage pre-pass alone: stats + quantize, no sums;
//     `sagesla_sparse` - `sagesla_prepass` ~ the kernel alone),
//     `sagesla_fused_prepare` (the same pre-pass writing the 64-token Q / smoothed-K
//     block sums), `sagesla_fused_select` (Tiled score from those sums + radix top-k),
//     `sagesla_fused_attend` (the sparse kernel alone on the prepared workspace),
//     `sagesla_fused_total` (everything, linear K/V half on a second stream, the
//     Staged linear kernels, as ops::sla fused with overlap: compare with
//     `sagesla_total_radix_overlap`, the default), `sagesla_fused_total_serial`
//     (the linear branch in line);
//     TD_SLA_FUSED=2 / SlaOptions::fused_kv_stats: `sagesla_fused_kv_prepare` (the
//     linear K/V pass writing the sage K mean / V scales too; compare with
//     `sagesla_linear_prepare_staged`), `sagesla_fused_kv_sage_prepare` (the sage
//     pre-pass without its statistics pass; compare with `sagesla_fused_prepare`),
//     `sagesla_fused_kv_total` (everything in line on one stream).
//   The Direct quantize kernel (SageQuantKernel::Direct / TD_SAGE_QUANT=direct):
//     `sagesla_prepass_direct`, `sagesla_fused_prepare_direct`,
//     `sagesla_fused_kv_sage_prepare_direct`, `sagesla_fused_kv_total_direct`
//     beside the keys without `_direct` (those pin the Default kernel).
//   `sagesla_fused_chain`: what ops::sla runs (the Direct quantize pass, the
//     projection after the sparse kernel, programmatic dependent launches;
//     TURBODIFF_PDL=0 for plain launches); its pieces
//     `sagesla_fused_kv_prepare_deferred` (the K/V pass and the statistics
//     folds) and `sagesla_linear_project_apply` (projection + apply).
//   BENCH_SLA_KEYS=sub1,sub2 times only keys containing one of the substrings,
//     BENCH_SLA_TOPK=0.1 only that topk (A/B calls).
//   The persistent linear apply (SlaLinearKernels::StagedPersist / TD_SLA_LINEAR=
//     persist): `sagesla_linear_apply_persist` beside `sagesla_linear_apply_staged`,
//     `sagesla_linear_prepare_persist` beside `sagesla_linear_prepare_staged`
//     (kv_project_rows), `sagesla_fused_kv_prepare_persist` beside
//     `sagesla_fused_kv_prepare`; `sagesla_fused_kv_total_direct_persist`: the
//     fused level-2 total with the Direct quantize pass and StagedPersist.
//   The Staged linear kernels (SlaLinearKernels::Staged): `linear_staged` beside
//     `linear` (whole branch), `sagesla_linear_prepare_staged` /
//     `sagesla_linear_apply_staged` beside `sagesla_linear_prepare` /
//     `sagesla_linear_apply` (the K/V half and the Q half alone).
// JSON on stdout. `bench_sla [--quick | --large-only]` (--quick: the smaller shape only; --large-only: the larger).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/attention/attention.h"
#include "kernels/sla/sla.h"
#if __has_include("ops/sage_attention.h")
#include "kernels/sage_attention/sage_attention.h"
#include "kernels/sage_attention/sage_prepass.h"
#define BENCH_HAVE_SAGE 1
#else
#define BENCH_HAVE_SAGE 0
#endif

using td::kernels::AttnLayout;
using td::kernels::AttnProblem;
using td::kernels::SlaProblem;
using td::kernels::Status;

namespace {

struct Shape {
  const char* name;
  int64_t len, heads;
};

int reps_for(double once_ms) { return once_ms > 100 ? 5 : once_ms > 10 ? 15 : 40; }

double once(const std::function<void(int)>& fn, cudaStream_t st) { return td::bench::time_cuda(fn, st, 1, 1).median_ms; }

// BENCH_SLA_KEYS=a,b,...: time only the keys containing one of these
// substrings (cuDNN always); BENCH_SLA_TOPK=x: only that topk. For A/B calls.
bool key_wanted(const std::string& key) {
  const char* env = std::getenv("BENCH_SLA_KEYS");
  if (!env || !*env) return true;
  const std::string list = env;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    const std::string part = list.substr(start, end - start);
    if (!part.empty() && key.find(part) != std::string::npos) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool large_only = argc > 1 && std::strcmp(argv[1], "--large-only") == 0;  // 1x40x75600 only (profiling)
  cudaStream_t stream;
  TD_BENCH_CUDA(cudaStreamCreate(&stream));
  nlohmann::json out;
  out["bench"] = "sla";
  out["device"] = td::bench::device_json();
  out["sage_kernel_in_build"] = bool(BENCH_HAVE_SAGE);
  nlohmann::json results = nlohmann::json::array();
  std::vector<Shape> shapes = {{"wan1.3b_480p", 32760, 12}, {"wan14b_720p", 75600, 40}};
  if (quick) shapes.resize(1);
  if (large_only) shapes.erase(shapes.begin());
  const int64_t D = 128, B = 1;
  for (const Shape& s : shapes) {
    const size_t n = size_t(B * s.len * s.heads * D);
    void *q, *k, *v, *o;
    TD_BENCH_CUDA(cudaMalloc(&q, n * 2));
    TD_BENCH_CUDA(cudaMalloc(&k, n * 2));
    TD_BENCH_CUDA(cudaMalloc(&v, n * 2));
    TD_BENCH_CUDA(cudaMalloc(&o, n * 2));
    td::bench::fill_random_bf16(q, n, 1.f, 1, stream);
    td::bench::fill_random_bf16(k, n, 1.f, 2, stream);
    td::bench::fill_random_bf16(v, n, 1.f, 3, stream);
    float* proj_w;
    float* proj_b;
    TD_BENCH_CUDA(cudaMalloc(&proj_w, D * D * 4));
    TD_BENCH_CUDA(cudaMalloc(&proj_b, D * 4));
    td::bench::fill_random_f32(proj_w, size_t(D * D), 0.05f, 4, stream);
    td::bench::fill_random_f32(proj_b, size_t(D), 0.05f, 5, stream);
    const double dense_flops = 4.0 * double(B * s.heads) * double(s.len) * double(s.len) * double(D);

    nlohmann::json base = {{"shape", s.name}, {"batch", B}, {"heads", s.heads}, {"len", s.len}, {"head_dim", D}};
    // cuDNN dense SDPA.
    double cudnn_ms = 0;
    AttnProblem ap = AttnProblem::make(AttnLayout::BLHD, B, s.heads, s.len, s.len, D);
#if TURBODIFF_HAVE_CUDNN
    {
      size_t ws_bytes = 0;
      Status st = td::kernels::attention_cudnn_workspace_size(ap, false, &ws_bytes);
      void* ws = nullptr;
      if (st == Status::Ok && ws_bytes) TD_BENCH_CUDA(cudaMalloc(&ws, ws_bytes));
      auto run = [&](int) { td::kernels::attention_cudnn(ap, q, k, v, o, nullptr, ws, ws_bytes, stream); };
      if (st == Status::Ok) st = td::kernels::attention_cudnn(ap, q, k, v, o, nullptr, ws, ws_bytes, stream);
      if (st == Status::Ok) {
        const auto t = td::bench::time_cuda(run, stream, 1, reps_for(once(run, stream)));
        cudnn_ms = t.median_ms;
        base["cudnn_ms"] = cudnn_ms;
        base["cudnn_tflops"] = dense_flops / (cudnn_ms * 1e-3) / 1e12;
      } else {
        base["cudnn_error"] = td::kernels::attention_last_error();
      }
      if (ws) cudaFree(ws);
    }
#else
    base["cudnn_error"] = "built without cuDNN";
#endif
    for (double topk : {0.05, 0.1, 0.15, 0.2}) {
      if (const char* only = std::getenv("BENCH_SLA_TOPK"); only && *only && std::fabs(std::atof(only) - topk) > 1e-9)
        continue;
      nlohmann::json r = base;
      r["topk"] = topk;
      SlaProblem p;
      p.batch = B;
      p.heads = s.heads;
      p.len = s.len;
      p.head_dim = D;
      p.q = p.k = p.v = p.o = td::kernels::attn_contiguous_strides(AttnLayout::BLHD, s.heads, s.len, D);
      p.scale = float(1.0 / std::sqrt(double(D)));
      p.topk = topk;
      p.topk_algo = td::kernels::SlaTopkAlgo::Bitonic;  // the default; `*_radix` keys time SlaTopkAlgo::Radix
      // The base keys time the earlier pipeline explicitly (Simple score kernel,
      // Warp linear kernels; ops::sla's defaults are now the Tiled / Staged /
      // fused path): `*_tiled`, `*_staged` and `sagesla_fused_*` time the new one.
      p.score_kernel = td::kernels::SlaScoreKernel::Simple;
      p.linear_kernels = td::kernels::SlaLinearKernels::Warp;
      auto record = [&](const std::string& key, const std::function<void(int)>& fn) {
        if (!key_wanted(key)) return 0.0;
        fn(0);
        const cudaError_t e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) {
          r[key + "_error"] = cudaGetErrorString(e);
          return 0.0;
        }
        const auto t = td::bench::time_cuda(fn, stream, 2, reps_for(once(fn, stream)));
        r[key + "_ms"] = t.median_ms;
        if (cudnn_ms > 0) r[key + "_speed_vs_cudnn"] = cudnn_ms / t.median_ms;
        return t.median_ms;
      };
      auto check = [&](Status st, const std::string& key) {
        if (st != Status::Ok) r[key + "_error"] = td::kernels::sla_last_error();
        return st == Status::Ok;
      };

      // ---- sla: 128 x 64 blocks, BF16 sparse kernel.
      {
        p.block_q = 128;
        p.block_k = 64;
        const int64_t n_sel = td::kernels::sla_selected_blocks(topk, p.key_blocks());
        r["sla_n_sel"] = n_sel;
        const size_t ws_bytes = td::kernels::sla_workspace_size(p);
        void* ws;
        int32_t* lut;
        TD_BENCH_CUDA(cudaMalloc(&ws, ws_bytes));
        TD_BENCH_CUDA(cudaMalloc(&lut, size_t(B * s.heads * p.query_blocks() * n_sel) * 4));
        const size_t sel_bytes = td::kernels::sla_block_select_workspace_size(p);
        const size_t lin_bytes = td::kernels::sla_linear_workspace_size(p);
        SlaProblem pr = p;  // the radix-select top-k variant, timed beside the default
        pr.topk_algo = td::kernels::SlaTopkAlgo::Radix;
        if (check(td::kernels::sla_block_select_cuda(pr, q, k, nullptr, lut, ws, sel_bytes, stream), "sla_select_radix"))
          record("sla_select_radix",
                 [&](int) { td::kernels::sla_block_select_cuda(pr, q, k, nullptr, lut, ws, sel_bytes, stream); });
        if (check(td::kernels::sla_block_select_cuda(p, q, k, nullptr, lut, ws, sel_bytes, stream), "sla_select")) {
          record("sla_select", [&](int) { td::kernels::sla_block_select_cuda(p, q, k, nullptr, lut, ws, sel_bytes, stream); });
          if (check(td::kernels::sla_sparse_cuda(p, q, k, v, lut, n_sel, o, nullptr, stream), "sla_sparse")) {
            const double ms =
                record("sla_sparse", [&](int) { td::kernels::sla_sparse_cuda(p, q, k, v, lut, n_sel, o, nullptr, stream); });
            if (ms > 0) {
              r["sla_sparse_dense_equiv_tflops"] = dense_flops / (ms * 1e-3) / 1e12;
              r["sla_sparse_actual_tflops"] = dense_flops * double(n_sel) / double(p.key_blocks()) / (ms * 1e-3) / 1e12;
            }
          }
        }
        if (check(td::kernels::sla_linear_add_cuda(p, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, ws,
                                                   lin_bytes, stream),
                  "linear"))
          record("linear", [&](int) {
            td::kernels::sla_linear_add_cuda(p, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, ws, lin_bytes,
                                             stream);
          });
        {  // the Staged linear kernels (SlaLinearKernels::Staged), beside `linear`
          SlaProblem ps = p;
          ps.linear_kernels = td::kernels::SlaLinearKernels::Staged;
          if (check(td::kernels::sla_linear_add_cuda(ps, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, ws,
                                                     lin_bytes, stream),
                    "linear_staged"))
            record("linear_staged", [&](int) {
              td::kernels::sla_linear_add_cuda(ps, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, ws,
                                               lin_bytes, stream);
            });
        }
        auto total = [&](int) {
          td::kernels::sla_cuda(p, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, nullptr, nullptr, nullptr, ws,
                                ws_bytes, stream);
        };
        if (check(td::kernels::sla_cuda(p, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, nullptr, nullptr,
                                        nullptr, ws, ws_bytes, stream),
                  "sla_total"))
          record("sla_total", total);
        if (check(td::kernels::sla_cuda(pr, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, nullptr, nullptr,
                                        nullptr, ws, ws_bytes, stream),
                  "sla_total_radix"))
          record("sla_total_radix", [&](int) {
            td::kernels::sla_cuda(pr, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, nullptr, nullptr, nullptr,
                                  ws, ws_bytes, stream);
          });
        SlaProblem pt = pr;  // the Tiled score GEMM (+ radix top-k)
        pt.score_kernel = td::kernels::SlaScoreKernel::Tiled;
        if (check(td::kernels::sla_block_select_cuda(pt, q, k, nullptr, lut, ws, sel_bytes, stream), "sla_select_tiled")) {
          record("sla_select_tiled",
                 [&](int) { td::kernels::sla_block_select_cuda(pt, q, k, nullptr, lut, ws, sel_bytes, stream); });
          record("sla_total_tiled", [&](int) {
            td::kernels::sla_cuda(pt, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, nullptr, nullptr, nullptr,
                                  ws, ws_bytes, stream);
          });
        }
        cudaFree(ws);
        cudaFree(lut);
      }
#if BENCH_HAVE_SAGE
      // ---- sagesla: 64 x 128 blocks on sm90 (128 x 64 elsewhere), the sage kernel.
      {
        int dev = 0, major = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        p.block_q = major == 9 ? 64 : 128;
        p.block_k = major == 9 ? 128 : 64;
        const int64_t n_sel = td::kernels::sla_selected_blocks(topk, p.key_blocks());
        r["sagesla_blocks"] = std::to_string(p.block_q) + "x" + std::to_string(p.block_k);
        r["sagesla_n_sel"] = n_sel;
        td::kernels::SageSparse sp;
        sp.n_sel = n_sel;
        sp.block_q = p.block_q;
        sp.block_k = p.block_k;
        const size_t sel_bytes = td::kernels::sla_block_select_workspace_size(p);
        const size_t lin_bytes = td::kernels::sla_linear_workspace_size(p);
        const size_t sage_bytes = td::kernels::sage_attention_workspace_size(ap, td::kernels::SageBackend::Auto);
        void *sel_ws, *lin_ws, *sage_ws;
        int32_t* lut;
        TD_BENCH_CUDA(cudaMalloc(&sel_ws, sel_bytes));
        TD_BENCH_CUDA(cudaMalloc(&lin_ws, lin_bytes));
        TD_BENCH_CUDA(cudaMalloc(&sage_ws, sage_bytes ? sage_bytes : 1));
        TD_BENCH_CUDA(cudaMalloc(&lut, size_t(B * s.heads * p.query_blocks() * n_sel) * 4));
        sp.lut = lut;
        Status st = td::kernels::sla_block_select_cuda(p, q, k, nullptr, lut, sel_ws, sel_bytes, stream);
        if (st == Status::Ok) st = td::kernels::sage_attention_supports(ap, &sp, td::kernels::SageBackend::Auto);
        if (st == Status::Ok)
          st = td::kernels::sage_attention_cuda(ap, q, k, v, o, nullptr, &sp, td::kernels::SageBackend::Auto, sage_ws,
                                                sage_bytes, stream);
        if (st != Status::Ok) {
          r["sagesla_error"] = std::string(td::kernels::sla_last_error()) + " / " + td::kernels::attention_last_error();
        } else {
          record("sagesla_select", [&](int) { td::kernels::sla_block_select_cuda(p, q, k, nullptr, lut, sel_ws, sel_bytes, stream); });
          SlaProblem pr = p;
          pr.topk_algo = td::kernels::SlaTopkAlgo::Radix;
          record("sagesla_select_radix",
                 [&](int) { td::kernels::sla_block_select_cuda(pr, q, k, nullptr, lut, sel_ws, sel_bytes, stream); });
          const double ms = record("sagesla_sparse", [&](int) {
            td::kernels::sage_attention_cuda(ap, q, k, v, o, nullptr, &sp, td::kernels::SageBackend::Auto, sage_ws,
                                             sage_bytes, stream);
          });
          if (ms > 0) r["sagesla_sparse_dense_equiv_tflops"] = dense_flops / (ms * 1e-3) / 1e12;
          record("sagesla_total", [&](int) {
            td::kernels::sla_block_select_cuda(p, q, k, nullptr, lut, sel_ws, sel_bytes, stream);
            td::kernels::sage_attention_cuda(ap, q, k, v, o, nullptr, &sp, td::kernels::SageBackend::Auto, sage_ws,
                                             sage_bytes, stream);
            td::kernels::sla_linear_add_cuda(p, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, lin_ws,
                                             lin_bytes, stream);
          });
          // The linear branch's K/V half on a second stream (forked before the
          // selection, joined before its Q half): what ops::sla does with
          // SlaOptions::overlap_linear / TD_SLA_OVERLAP=1.
          cudaStream_t aux;
          cudaEvent_t fork_ev, join_ev;
          TD_BENCH_CUDA(cudaStreamCreateWithFlags(&aux, cudaStreamNonBlocking));
          TD_BENCH_CUDA(cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming));
          TD_BENCH_CUDA(cudaEventCreateWithFlags(&join_ev, cudaEventDisableTiming));
          for (const bool radix : {false, true})
            record(radix ? "sagesla_total_radix_overlap" : "sagesla_total_overlap", [&](int) {
              td::kernels::sla_stream_wait(aux, stream, fork_ev);
              td::kernels::sla_linear_prepare_cuda(p, k, v, proj_w, proj_b, td::kernels::ElemType::F32, lin_ws,
                                                   lin_bytes, aux);
              td::kernels::sla_block_select_cuda(radix ? pr : p, q, k, nullptr, lut, sel_ws, sel_bytes, stream);
              td::kernels::sage_attention_cuda(ap, q, k, v, o, nullptr, &sp, td::kernels::SageBackend::Auto, sage_ws,
                                               sage_bytes, stream);
              td::kernels::sla_stream_wait(stream, aux, join_ev);
              td::kernels::sla_linear_apply_cuda(p, q, o, lin_ws, lin_bytes, stream);
            });
          record("sagesla_linear_prepare", [&](int) {
            td::kernels::sla_linear_prepare_cuda(p, k, v, proj_w, proj_b, td::kernels::ElemType::F32, lin_ws,
                                                 lin_bytes, stream);
          });
          record("sagesla_linear_apply",
                 [&](int) { td::kernels::sla_linear_apply_cuda(p, q, o, lin_ws, lin_bytes, stream); });
          SlaProblem pstaged = p;  // the Staged linear kernels (SlaLinearKernels::Staged)
          pstaged.linear_kernels = td::kernels::SlaLinearKernels::Staged;
          record("sagesla_linear_prepare_staged", [&](int) {
            td::kernels::sla_linear_prepare_cuda(pstaged, k, v, proj_w, proj_b, td::kernels::ElemType::F32, lin_ws,
                                                 lin_bytes, stream);
          });
          record("sagesla_linear_apply_staged",
                 [&](int) { td::kernels::sla_linear_apply_cuda(pstaged, q, o, lin_ws, lin_bytes, stream); });
          // The persistent apply (SlaLinearKernels::StagedPersist, TD_SLA_LINEAR=persist; the same
          // bits). Prediction (H200 ~3.5 TB/s; Q read, o read + written): 1x12x32760 302 MB ->
          // ~0.09-0.10 ms (Staged 0.154); 1x40x75600 2.32 GB -> ~0.70-0.75 ms (Staged 1.048).
          SlaProblem ppersist = pstaged;
          ppersist.linear_kernels = td::kernels::SlaLinearKernels::StagedPersist;
          record("sagesla_linear_apply_persist",
                 [&](int) { td::kernels::sla_linear_apply_cuda(ppersist, q, o, lin_ws, lin_bytes, stream); });
          // Its K/V half (Staged kv_partial + kv_project_rows; the same bits). Prediction: the
          // kv_project share drops to ~0.02-0.03 ms (one read of the fp32 partials).
          record("sagesla_linear_prepare_persist", [&](int) {
            td::kernels::sla_linear_prepare_cuda(ppersist, k, v, proj_w, proj_b, td::kernels::ElemType::F32, lin_ws,
                                                 lin_bytes, stream);
          });
          SlaProblem pt = pr;  // the Tiled score GEMM (+ radix top-k)
          pt.score_kernel = td::kernels::SlaScoreKernel::Tiled;
          record("sagesla_select_tiled",
                 [&](int) { td::kernels::sla_block_select_cuda(pt, q, k, nullptr, lut, sel_ws, sel_bytes, stream); });
          // The fused path, stage by stage and whole (what ops::sla does with SlaOptions::fused).
          {
            const td::kernels::SageBackend be =
                td::kernels::sage_attention_supports(ap, &sp, td::kernels::SageBackend::Sm90) == Status::Ok
                    ? td::kernels::SageBackend::Sm90
                    : td::kernels::SageBackend::Portable;
            const int64_t nb = td::kernels::sage_sum64_blocks(s.len);
            float* sums_buf;
            TD_BENCH_CUDA(cudaMalloc(&sums_buf, size_t(2 * B * s.heads * nb * D) * 4));
            td::kernels::SagePoolSums sums;
            sums.q_sum64 = sums_buf;
            sums.k_sum64 = sums_buf + B * s.heads * nb * D;
            // The base keys pin the Default quantize kernel (TD_SAGE_QUANT does not move them).
            sums.quant_kernel = td::kernels::SageQuantKernel::Default;
            td::kernels::SagePoolSums no_sums;
            no_sums.quant_kernel = td::kernels::SageQuantKernel::Default;
            auto prepare = [&](const td::kernels::SagePoolSums& ps) {
              return td::kernels::sage_prepare_cuda(ap, q, k, v, &sp, be, ps, sage_ws, sage_bytes, stream);
            };
            auto select = [&] {
              return td::kernels::sla_block_select_from_sums_cuda(pr, sums.q_sum64, nb, sums.k_sum64, nb, nullptr, lut,
                                                                  sel_ws, sel_bytes, stream);
            };
            auto attend = [&] {
              return td::kernels::sage_attend_cuda(ap, o, nullptr, &sp, be, sage_ws, sage_bytes, stream);
            };
            if (check(prepare(no_sums), "sagesla_prepass")) record("sagesla_prepass", [&](int) { prepare(no_sums); });
            if (check(prepare(sums), "sagesla_fused_prepare") && check(select(), "sagesla_fused_select") &&
                check(attend(), "sagesla_fused_attend")) {
              record("sagesla_fused_prepare", [&](int) { prepare(sums); });
              record("sagesla_fused_select", [&](int) { select(); });
              // The radix select with a CTA per row (SlaTopkAlgo::RadixCta; the
              // default's warp per row gives the same LUT) beside it.
              {
                td::kernels::SlaProblem pc = pr;
                pc.topk_algo = td::kernels::SlaTopkAlgo::RadixCta;
                record("sagesla_fused_select_radix_cta", [&](int) {
                  td::kernels::sla_block_select_from_sums_cuda(pc, sums.q_sum64, nb, sums.k_sum64, nb, nullptr, lut,
                                                               sel_ws, sel_bytes, stream);
                });
              }
              const double ams = record("sagesla_fused_attend", [&](int) { attend(); });
              if (ams > 0) r["sagesla_fused_attend_dense_equiv_tflops"] = dense_flops / (ams * 1e-3) / 1e12;
              record("sagesla_fused_total", [&](int) {
                td::kernels::sla_stream_wait(aux, stream, fork_ev);
                td::kernels::sla_linear_prepare_cuda(pstaged, k, v, proj_w, proj_b, td::kernels::ElemType::F32, lin_ws,
                                                     lin_bytes, aux);
                prepare(sums);
                select();
                attend();
                td::kernels::sla_stream_wait(stream, aux, join_ev);
                td::kernels::sla_linear_apply_cuda(pstaged, q, o, lin_ws, lin_bytes, stream);
              });
              record("sagesla_fused_total_serial", [&](int) {
                prepare(sums);
                select();
                attend();
                td::kernels::sla_linear_add_cuda(pstaged, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, lin_ws,
                                                 lin_bytes, stream);
              });
            }
            // TD_SLA_FUSED=2: the linear K/V pass also makes the sage statistics, in line.
            td::kernels::SagePoolSums sums_given = sums;
            sums_given.stats_given = true;
            const td::kernels::SageStatsSlots slots = td::kernels::sage_stats_slots(ap, be, sage_ws);
            td::kernels::SlaSageStats stats;
            stats.km = slots.km;
            stats.vscale = slots.vscale;
            stats.vinv = slots.vinv;
            auto kv_prepare = [&] {
              return td::kernels::sla_linear_prepare_stats_cuda(pstaged, k, v, proj_w, proj_b,
                                                                td::kernels::ElemType::F32, stats, lin_ws, lin_bytes,
                                                                stream);
            };
            if (check(kv_prepare(), "sagesla_fused_kv_prepare") &&
                check(prepare(sums_given), "sagesla_fused_kv_sage_prepare")) {
              record("sagesla_fused_kv_prepare", [&](int) { kv_prepare(); });
              record("sagesla_fused_kv_sage_prepare", [&](int) { prepare(sums_given); });
              record("sagesla_fused_kv_total", [&](int) {
                kv_prepare();
                prepare(sums_given);
                select();
                attend();
                td::kernels::sla_linear_apply_cuda(pstaged, q, o, lin_ws, lin_bytes, stream);
              });
            }
            // The Direct quantize kernel (SageQuantKernel::Direct, TD_SAGE_QUANT=direct; the
            // same bits) beside the Default: `sagesla_prepass_direct` (stats + quantize, no
            // sums), `sagesla_fused_prepare_direct` (with the sums),
            // `sagesla_fused_kv_sage_prepare_direct` (stats given: the quantize pass alone),
            // `sagesla_fused_kv_total_direct`.
            // Prediction (H200 ~3.5 TB/s; quantize pass = read Q, K, V + write INT8 Q, K,
            // e4m3 Vᵀ): 1x12x32760: 453 MB -> ~0.14 ms (Default 0.281);
            // 1x40x75600: 3.48 GB -> ~1.0-1.1 ms (Default 2.05); kv_total -1.0 ms there.
            {
              td::kernels::SagePoolSums no_sums_d = no_sums, sums_d = sums, sums_given_d = sums_given;
              no_sums_d.quant_kernel = sums_d.quant_kernel = sums_given_d.quant_kernel =
                  td::kernels::SageQuantKernel::Direct;
              if (check(prepare(no_sums_d), "sagesla_prepass_direct"))
                record("sagesla_prepass_direct", [&](int) { prepare(no_sums_d); });
              if (check(prepare(sums_d), "sagesla_fused_prepare_direct"))
                record("sagesla_fused_prepare_direct", [&](int) { prepare(sums_d); });
              if (check(kv_prepare(), "sagesla_fused_kv_prepare") &&
                  check(prepare(sums_given_d), "sagesla_fused_kv_sage_prepare_direct")) {
                record("sagesla_fused_kv_sage_prepare_direct", [&](int) { prepare(sums_given_d); });
                record("sagesla_fused_kv_total_direct", [&](int) {
                  kv_prepare();
                  prepare(sums_given_d);
                  select();
                  attend();
                  td::kernels::sla_linear_apply_cuda(pstaged, q, o, lin_ws, lin_bytes, stream);
                });
                // ops::sla's chain: the projection deferred to after the sparse kernel, the
                // launches programmatic dependents (pdl.cuh; TURBODIFF_PDL=0: plain launches).
                td::kernels::SlaSageStats stats_deferred = stats;
                stats_deferred.defer_projection = true;
                record("sagesla_fused_kv_prepare_deferred", [&](int) {
                  td::kernels::sla_linear_prepare_stats_cuda(pstaged, k, v, proj_w, proj_b, td::kernels::ElemType::F32,
                                                             stats_deferred, lin_ws, lin_bytes, stream);
                });
                record("sagesla_linear_project_apply", [&](int) {
                  td::kernels::sla_linear_project_apply_cuda(pstaged, q, o, proj_w, proj_b, td::kernels::ElemType::F32,
                                                             lin_ws, lin_bytes, stream);
                });
                record("sagesla_fused_chain", [&](int) {
                  td::kernels::sla_linear_prepare_stats_cuda(pstaged, k, v, proj_w, proj_b, td::kernels::ElemType::F32,
                                                             stats_deferred, lin_ws, lin_bytes, stream);
                  prepare(sums_given_d);
                  select();
                  attend();
                  td::kernels::sla_linear_project_apply_cuda(pstaged, q, o, proj_w, proj_b, td::kernels::ElemType::F32,
                                                             lin_ws, lin_bytes, stream);
                });
                // Both variants: Direct quantize pass + StagedPersist (kv_project_rows, persistent apply).
                auto kv_prepare_p = [&] {
                  return td::kernels::sla_linear_prepare_stats_cuda(ppersist, k, v, proj_w, proj_b,
                                                                    td::kernels::ElemType::F32, stats, lin_ws,
                                                                    lin_bytes, stream);
                };
                record("sagesla_fused_kv_prepare_persist", [&](int) { kv_prepare_p(); });
                record("sagesla_fused_kv_total_direct_persist", [&](int) {
                  kv_prepare_p();
                  prepare(sums_given_d);
                  select();
                  attend();
                  td::kernels::sla_linear_apply_cuda(ppersist, q, o, lin_ws, lin_bytes, stream);
                });
              }
            }
            cudaFree(sums_buf);
          }
          cudaEventDestroy(fork_ev);
          cudaEventDestroy(join_ev);
          cudaStreamDestroy(aux);
          record("sagesla_total_radix", [&](int) {
            td::kernels::sla_block_select_cuda(pr, q, k, nullptr, lut, sel_ws, sel_bytes, stream);
            td::kernels::sage_attention_cuda(ap, q, k, v, o, nullptr, &sp, td::kernels::SageBackend::Auto, sage_ws,
                                             sage_bytes, stream);
            td::kernels::sla_linear_add_cuda(p, q, k, v, proj_w, proj_b, td::kernels::ElemType::F32, o, lin_ws,
                                             lin_bytes, stream);
          });
        }
        cudaFree(sel_ws);
        cudaFree(lin_ws);
        cudaFree(sage_ws);
        cudaFree(lut);
      }
#endif
      results.push_back(r);
      std::fprintf(stderr, "%s\n", r.dump().c_str());
    }
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(o);
    cudaFree(proj_w);
    cudaFree(proj_b);
  }
  out["results"] = results;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
