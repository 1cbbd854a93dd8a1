// Exact attention on Wan's shapes: our cuDNN path (attention_cudnn, the
// `original` default) and the portable flash kernel (attention_flash_cuda).
// BF16, head_dim 128, (B, L, H, D) as the QKV projections produce it (one shape
// also in (B, H, L, D)); self-attention at 480p / 720p token counts and
// cross-attention against 512 text tokens. Median of CUDA-event timings after a
// warm-up (which also builds the cuDNN plan); TFLOP/s = 4·B·H·Lq·Lk·D / time.
// Repetitions are sized to ~1 s per kernel and shape (3 at least), so the whole
// run stays well under two minutes. Prints JSON; compare with
// bench/torch_attention.py run on the same GPU.
//
// SageAttention (sage_attention_cuda, quantization pre-pass included in every
// timing) on every backend the device runs ("sage_<backend>"), dense, and
// block-sparse at topk 0.05 / 0.1 / 0.2 with a random valid LUT (SageSLA's
// blocks: 64x128 on sm_90a, 128x64 portable) on the self-attention shapes;
// sparse TFLOP/s are dense-equivalent (the dense FLOP count / time).
// (The sm_90a schedule variants once timed side by side here, pingpong,
// fastcvt, lean, stages3 and their combinations, were removed with their
// kernels; their figures stay in docs/benchmarks.md.)
//   bench_attention [name-filter-substring] [--no-flash] [--no-sparse]
#include <cuda_bf16.h>
#if TURBODIFF_HAVE_CUDNN
#include <cudnn.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/dtype.h"
#include "kernels/attention/attention.h"
#include "kernels/sage_attention/sage_attention.h"

namespace {

using td::kernels::AttnLayout;
using td::kernels::AttnProblem;
using td::kernels::Status;

struct BenchShape {
  const char* name;
  int64_t batch, heads, len_q, len_kv, head_dim;
  AttnLayout layout;
};

const BenchShape kShapes[] = {
    {"wan1.3b_480p_self", 1, 12, 32760, 32760, 128, AttnLayout::BLHD},
    {"wan1.3b_480p_self_bhld", 1, 12, 32760, 32760, 128, AttnLayout::BHLD},
    {"wan14b_480p_self", 1, 40, 32760, 32760, 128, AttnLayout::BLHD},
    {"wan14b_720p_self", 1, 40, 75600, 75600, 128, AttnLayout::BLHD},
    {"wan1.3b_480p_cross", 1, 12, 32760, 512, 128, AttnLayout::BLHD},
    {"wan14b_720p_cross", 1, 40, 75600, 512, 128, AttnLayout::BLHD},
};

size_t elems(const BenchShape& s, int64_t len) { return size_t(s.batch * s.heads * len * s.head_dim); }

// Repetitions for ~target_ms of timed work, from one untimed-warm-up run's time.
int reps_for(double one_run_ms, double target_ms = 1000.0) {
  const int r = int(target_ms / std::max(one_run_ms, 1e-3));
  return std::min(50, std::max(3, r));
}

double time_once(const std::function<void(int)>& fn, cudaStream_t stream) {
  return td::bench::time_cuda(fn, stream, 1, 1).median_ms;
}

// Relative L2 difference of the first n elements of two bf16 device buffers (on the host).
double rel_l2_sample(const void* a, const void* b, size_t n) {
  std::vector<uint16_t> ha(n), hb(n);
  TD_BENCH_CUDA(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost));
  TD_BENCH_CUDA(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = td::bf16_to_f32(ha[i]), y = td::bf16_to_f32(hb[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

int main(int argc, char** argv) {
  std::string filter;
  bool run_flash = true, run_sparse = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-flash") run_flash = false;
    else if (a == "--no-sparse") run_sparse = false;
    else filter = a;
  }
  cudaStream_t stream;
  TD_BENCH_CUDA(cudaStreamCreate(&stream));
  nlohmann::json out;
  out["bench"] = "attention";
  out["device"] = td::bench::device_json();
  out["flops_formula"] = "4*B*H*Lq*Lk*D";
#if TURBODIFF_HAVE_CUDNN
  out["cudnn_version"] = cudnnGetVersion();  // the library loaded at run time
#endif
  nlohmann::json results = nlohmann::json::array();

  for (const BenchShape& s : kShapes) {
    if (!filter.empty() && std::string(s.name).find(filter) == std::string::npos) continue;
    const AttnProblem p = AttnProblem::make(s.layout, s.batch, s.heads, s.len_q, s.len_kv, s.head_dim);
    const size_t nq = elems(s, s.len_q), nkv = elems(s, s.len_kv);
    void *q, *k, *v, *o_cudnn, *o_flash;
    float* lse;
    TD_BENCH_CUDA(cudaMalloc(&q, nq * 2));
    TD_BENCH_CUDA(cudaMalloc(&k, nkv * 2));
    TD_BENCH_CUDA(cudaMalloc(&v, nkv * 2));
    TD_BENCH_CUDA(cudaMalloc(&o_cudnn, nq * 2));
    TD_BENCH_CUDA(cudaMalloc(&o_flash, nq * 2));
    TD_BENCH_CUDA(cudaMalloc(&lse, size_t(td::kernels::attention_lse_count(p)) * 4));
    td::bench::fill_random_bf16(q, nq, 1.f, 1, stream);
    td::bench::fill_random_bf16(k, nkv, 1.f, 2, stream);
    td::bench::fill_random_bf16(v, nkv, 1.f, 3, stream);
    TD_BENCH_CUDA(cudaStreamSynchronize(stream));

    const double flop = 4.0 * double(s.batch) * double(s.heads) * double(s.len_q) * double(s.len_kv) * double(s.head_dim);
    nlohmann::json r = {{"name", s.name},       {"batch", s.batch},       {"heads", s.heads},
                        {"len_q", s.len_q},     {"len_kv", s.len_kv},     {"head_dim", s.head_dim},
                        {"layout", s.layout == AttnLayout::BLHD ? "BLHD" : "BHLD"}, {"gflop", flop / 1e9}};
    auto record = [&](const char* key, const td::bench::Timing& t) {
      r[std::string(key) + "_ms"] = t.median_ms;
      r[std::string(key) + "_min_ms"] = t.min_ms;
      r[std::string(key) + "_runs"] = t.runs;
      r[std::string(key) + "_tflops"] = flop / (t.median_ms * 1e-3) / 1e12;
    };

#if TURBODIFF_HAVE_CUDNN
    {
      // Both graphs (without and with the LSE output) are built here, before timing.
      size_t ws_plain = 0, ws_lse = 0;
      Status st = td::kernels::attention_cudnn_workspace_size(p, false, &ws_plain);
      if (st == Status::Ok) st = td::kernels::attention_cudnn_workspace_size(p, true, &ws_lse);
      const size_t ws_bytes = std::max(ws_plain, ws_lse);
      void* ws = nullptr;
      if (st == Status::Ok && ws_bytes) TD_BENCH_CUDA(cudaMalloc(&ws, ws_bytes));
      auto run = [&](int) {
        if (st == Status::Ok) st = td::kernels::attention_cudnn(p, q, k, v, o_cudnn, nullptr, ws, ws_bytes, stream);
      };
      auto run_lse = [&](int) {
        if (st == Status::Ok) st = td::kernels::attention_cudnn(p, q, k, v, o_cudnn, lse, ws, ws_bytes, stream);
      };
      if (st == Status::Ok) {
        const td::bench::Timing t_lse = td::bench::time_cuda(run_lse, stream, 1, reps_for(time_once(run_lse, stream), 300.0));
        // the plain run last, so o_cudnn holds its output for the comparison below
        const td::bench::Timing t = td::bench::time_cuda(run, stream, 1, reps_for(time_once(run, stream)));
        if (st == Status::Ok) {
          record("cudnn", t);
          record("cudnn_lse", t_lse);
          r["cudnn_workspace_bytes"] = ws_bytes;
        }
      }
      if (st != Status::Ok) r["cudnn_error"] = td::kernels::attention_last_error();
      if (ws) cudaFree(ws);
    }
#else
    r["cudnn_error"] = "built without cuDNN";
#endif

    if (run_flash) {
      Status st = Status::Ok;
      auto run = [&](int) {
        if (st == Status::Ok) st = td::kernels::attention_flash_cuda(p, q, k, v, o_flash, nullptr, stream);
      };
      auto run_lse = [&](int) {
        if (st == Status::Ok) st = td::kernels::attention_flash_cuda(p, q, k, v, o_flash, lse, stream);
      };
      run_lse(0);
      if (st == Status::Ok) {
        const td::bench::Timing t_lse = td::bench::time_cuda(run_lse, stream, 1, reps_for(time_once(run_lse, stream), 300.0));
        const td::bench::Timing t = td::bench::time_cuda(run, stream, 1, reps_for(time_once(run, stream)));
        if (st == Status::Ok) {
          record("flash", t);
          record("flash_lse", t_lse);
        }
      }
      if (st != Status::Ok) r["flash_error"] = td::kernels::attention_last_error();
    }

    if (r.contains("cudnn_ms") && r.contains("flash_ms")) {
      r["flash_speed_vs_cudnn"] = r["cudnn_ms"].get<double>() / r["flash_ms"].get<double>();
      // Both outputs should agree to bf16 precision (sanity check, not a test).
      r["flash_vs_cudnn_rel_l2_first_1M"] = rel_l2_sample(o_flash, o_cudnn, std::min<size_t>(nq, size_t(1) << 20));
    }
    // SageAttention: each backend the device runs; dense, then sparse.
    for (const td::kernels::SageBackend be : {td::kernels::SageBackend::Sm90, td::kernels::SageBackend::Portable}) {
      const bool sm90 = be == td::kernels::SageBackend::Sm90;
      const std::string key = sm90 ? "sage_sm90" : "sage_portable";
      if (td::kernels::sage_attention_supports(p, nullptr, be) != Status::Ok) {
        r[key + "_error"] = td::kernels::attention_last_error();
        continue;
      }
      const size_t ws_bytes = td::kernels::sage_attention_workspace_size(p, be);
      void* ws = nullptr;
      TD_BENCH_CUDA(cudaMalloc(&ws, ws_bytes));
      Status st = Status::Ok;
      auto run = [&](int) {
        if (st == Status::Ok)
          st = td::kernels::sage_attention_cuda(p, q, k, v, o_flash, nullptr, nullptr, be, ws, ws_bytes, stream);
      };
      run(0);
      if (st == Status::Ok) {
        const td::bench::Timing t = td::bench::time_cuda(run, stream, 1, reps_for(time_once(run, stream)));
        if (st == Status::Ok) {
          record(key.c_str(), t);
          r[key + "_workspace_bytes"] = ws_bytes;
          if (r.contains("cudnn_ms")) {
            r[key + "_speed_vs_cudnn"] = r["cudnn_ms"].get<double>() / t.median_ms;
            r[key + "_vs_cudnn_rel_l2_first_1M"] = rel_l2_sample(o_flash, o_cudnn, std::min<size_t>(nq, size_t(1) << 20));
          }
        }
      }
      if (st != Status::Ok) r[key + "_error"] = td::kernels::attention_last_error();
      if (run_sparse && s.len_q == s.len_kv && st == Status::Ok) {
        const int64_t bq = sm90 ? 64 : 128, bk = sm90 ? 128 : 64;
        const int64_t QB = (s.len_q + bq - 1) / bq, KB = (s.len_kv + bk - 1) / bk;
        for (const double topk : {0.05, 0.1, 0.2}) {
          const int64_t n_sel = std::max<int64_t>(1, int64_t(topk * double(KB)));
          std::vector<int32_t> lut;
          std::vector<int32_t> all(static_cast<size_t>(KB));
          std::mt19937 gen(1234);
          for (int64_t row = 0; row < s.batch * s.heads * QB; ++row) {
            for (int64_t i = 0; i < KB; ++i) all[size_t(i)] = int32_t(i);
            std::shuffle(all.begin(), all.end(), gen);
            lut.insert(lut.end(), all.begin(), all.begin() + n_sel);
          }
          int32_t* lut_dev = nullptr;
          TD_BENCH_CUDA(cudaMalloc(&lut_dev, lut.size() * 4));
          TD_BENCH_CUDA(cudaMemcpy(lut_dev, lut.data(), lut.size() * 4, cudaMemcpyHostToDevice));
          TD_BENCH_CUDA(cudaDeviceSynchronize());  // pageable H2D may return before its DMA lands
          const td::kernels::SageSparse sp{lut_dev, n_sel, bq, bk};
          Status sst = Status::Ok;
          auto run_sp = [&](int) {
            if (sst == Status::Ok)
              sst = td::kernels::sage_attention_cuda(p, q, k, v, o_flash, nullptr, &sp, be, ws, ws_bytes, stream);
          };
          sst = Status::Ok;
          run_sp(0);
          char name[80];
          std::snprintf(name, sizeof name, "%s_sparse_topk%.2f", key.c_str(), topk);
          if (sst == Status::Ok) {
            const td::bench::Timing t = td::bench::time_cuda(run_sp, stream, 1, reps_for(time_once(run_sp, stream), 300.0));
            if (sst == Status::Ok) {
              record(name, t);
              r[std::string(name) + "_n_sel"] = n_sel;
              r[std::string(name) + "_blocks"] = std::to_string(bq) + "x" + std::to_string(bk);
            }
          }
          if (sst != Status::Ok) r[std::string(name) + "_error"] = td::kernels::attention_last_error();
          cudaFree(lut_dev);
        }
      }
      cudaFree(ws);
    }

    results.push_back(r);
    std::fprintf(stderr, "%s\n", r.dump().c_str());
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(o_cudnn);
    cudaFree(o_flash);
    cudaFree(lse);
  }
  out["results"] = results;
  std::printf("%s\n", out.dump(1).c_str());
  cudaStreamDestroy(stream);
  return 0;
}
