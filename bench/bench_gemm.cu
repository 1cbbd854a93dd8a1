// Benchmark of the W8A8 INT8 GEMMs (kernels/gemm/int8_gemm.h) at Wan's linear
// shapes against cuBLAS BF16 (cublasGemmEx, bf16 in/out, fp32 accumulation:
// what F.linear runs), measured in the same process on the same GPU.
//
// out[M, N] = A[M, K] . W[N, K]^T. FLOP = 2 M N K; "expected" is the time at
// 1500 TOP/s (~75% of the H200's dense INT8 peak, 1.9x its ~790 TFLOP/s BF16):
//
//   shape       M      K      N      GFLOP   at 1500 TOP/s   BF16 at 790
//   1.3B qkv    32760  1536   1536    154.6     0.103 ms      0.196 ms
//   1.3B ffn1   32760  1536   8960    901.7     0.601 ms      1.141 ms
//   1.3B ffn2   32760  8960   1536    901.7     0.601 ms      1.141 ms
//   14B qkv     75600  5120   5120   3963.6     2.642 ms      5.017 ms
//   14B ffn1    75600  5120  13824  10701.8     7.135 ms     13.547 ms
//   14B ffn2    75600 13824   5120  10701.8     7.135 ms     13.547 ms
//   M = 512:    1536->1536 2.42 G (1.6 us), 1536->8960 and 8960->1536 14.1 G
//               (9.4 us), 5120->5120 26.8 G (17.9 us), 5120->13824 and
//               13824->5120 72.5 G (48.3 us): launch- and wave-bound.
//
// Variants per shape (GEMM alone, no epilogue, unless named):
//   cublas_bf16                      the baseline
//   post_scale_sm90                  CUTLASS TMA/wgmma, int32 over all K (the lean epilogue instance)
//   post_scale_sm90_full_epilogue_tree  the same call on the full epilogue instance (TURBODIFF_GEMM_SM90_LEAN=0)
//   post_scale_sm90_quant            + per-token activation quantization (quant_per_row_cuda)
//   post_scale_sm90_epilogue         + bias and GELU (ffn1) or gated residual (qkv, ffn2)
//   block_scaled_sm90_token128       promotion per 128-deep K block, 1x128 activation groups
//   block_scaled_sm90_token128_quant + quant_token128_cuda
//   block_scaled_sm90_block128       128x128 activation blocks (TurboDiffusion's format)
//   block_scaled_sm90_block128_quant + quant_block128_cuda
//   block_scaled_sm90_token128_epilogue  + bias and GELU (ffn1) or gated residual (qkv, ffn2)
//   block_scaled_sm90_token128{,_epilogue}_{inline,deferred}  the same two calls with the
//                                    epilogue forced inline (consumers, after each tile) or
//                                    deferred (two producer-group warps, under the next tile)
//                                    by TURBODIFF_GEMM_SM90_BLOCK_EPI
//   post_scale_mma / block_scaled_mma_token128   the portable mma.sync kernels
// Plus "accuracy_vs_bf16" at 32760 x 1536 -> 1536: rel L2 and cosine of each
// scheme (with its own quantizers) against the BF16 linear on activations with
// outlier channels (every 128th channel x50).
// Each reports the median time over CUDA-event-timed runs after warm-up, TOP/s
// and the ratio of cuBLAS BF16's time to its own (> 1: faster than BF16).
// Inputs rotate among copies when one set fits in twice the L2. The activation
// quantizers run standalone here; in the model the QKV/FFN1 inputs come from
// the fused norm+quantize kernels instead.
//
//   bench_gemm [--filter SUBSTR] [--small-only | --large-only]
// prints one JSON object. Tile order of the sm90 post-scale kernel can be
// varied with TURBODIFF_GEMM_SM90_SWIZZLE / TURBODIFF_GEMM_SM90_RASTER.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/gemm/int8_gemm.h"
#include "kernels/quant/quant_block128.h"
#include "kernels/quant/quant_per_row.h"
#include "kernels/quant/quant_token128.h"

namespace {

using td::bench::Timing;
using td::kernels::ElemType;
using td::kernels::Status;

#define TD_CUBLAS(call)                                                                    \
  do {                                                                                     \
    cublasStatus_t _s = (call);                                                            \
    if (_s != CUBLAS_STATUS_SUCCESS) {                                                     \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, int(_s)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// The Hopper kernels exist only in builds with sm_90a (TURBODIFF_HAVE_SM90);
// main() runs them only on a cc 9.0 GPU of such a build.
Status post_scale_sm90(const td::kernels::Int8GemmPostScaleArgs& args, cudaStream_t stream) {
#if TURBODIFF_HAVE_SM90
  return td::kernels::int8_gemm_post_scale_sm90(args, stream);
#else
  (void)args, (void)stream;
  return Status::Unsupported;
#endif
}
Status block_scaled_sm90(const td::kernels::Int8GemmBlockScaledArgs& args, cudaStream_t stream) {
#if TURBODIFF_HAVE_SM90
  return td::kernels::int8_gemm_block_scaled_sm90(args, stream);
#else
  (void)args, (void)stream;
  return Status::Unsupported;
#endif
}

void require_ok(Status s, const char* what) {
  if (s != Status::Ok) {
    std::fprintf(stderr, "bench_gemm: %s returned '%s'\n", what, td::kernels::status_str(s));
    std::exit(1);
  }
}

void* dalloc(size_t bytes) {
  void* p = nullptr;
  TD_BENCH_CUDA(cudaMalloc(&p, bytes));
  return p;
}

__global__ void fill_i8_kernel(int8_t* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 0x9e3779b9u ^ seed * 0x85ebca6bu ^ unsigned(i >> 32);
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    p[i] = int8_t(x & 0xff);
  }
}
void fill_i8(void* p, size_t n, unsigned seed, cudaStream_t s) {
  fill_i8_kernel<<<1024, 256, 0, s>>>(static_cast<int8_t*>(p), n, seed);
  TD_BENCH_CUDA(cudaGetLastError());
}
// Positive scales ~1/127 (never zero: zero scales could let a kernel skip work).
__global__ void fill_scale_kernel(float* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 0x27d4eb2du ^ seed;
    x ^= x >> 15;
    x *= 0x2c1b3c6dU;
    x ^= x >> 12;
    p[i] = (0.5f + float(x >> 8) * (1.5f / 16777216.f)) / 127.f;
  }
}
void fill_scales(void* p, size_t n, unsigned seed, cudaStream_t s) {
  fill_scale_kernel<<<256, 256, 0, s>>>(static_cast<float*>(p), n, seed);
  TD_BENCH_CUDA(cudaGetLastError());
}

struct Shape {
  const char* name;
  int64_t M, K, N;
  const char* epilogue;  // "gelu" (FFN up) or "gated" (attention out / FFN down)
};

struct Options {
  std::string filter;
  bool small_only = false, large_only = false;
};

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

nlohmann::json bench_shape(const Shape& sh, const Options& opt, cublasHandle_t blas, cudaStream_t stream,
                           bool sm90) {
  const int64_t M = sh.M, K = sh.K, N = sh.N, kb = cdiv(K, 128);
  const double flop = 2.0 * double(M) * double(N) * double(K);
  const bool large = M > 4096;
  const int warmup = large ? 3 : 20, reps = large ? 15 : 100;

  // One "set" = everything a run reads. Rotate sets when a set fits in 2x L2.
  const size_t set_bytes = size_t(M * K) * 3 + size_t(N * K) * 3 + size_t(M * N) * 2;
  const int sets = td::bench::rotation_count(set_bytes);
  struct Set {
    void *x, *a, *w8, *w16, *sa_tok, *sa_t128, *sa_b128, *sw_ch, *sw_blk;
  };
  std::vector<Set> s(static_cast<size_t>(sets));
  for (int i = 0; i < sets; ++i) {
    Set& t = s[size_t(i)];
    const unsigned seed = 100u * unsigned(i + 1);
    t.x = dalloc(size_t(M * K) * 2);
    t.a = dalloc(size_t(M * K));
    t.w8 = dalloc(size_t(N * K));
    t.w16 = dalloc(size_t(N * K) * 2);
    t.sa_tok = dalloc(size_t(M) * 4);
    t.sa_t128 = dalloc(size_t(kb * M) * 4);
    t.sa_b128 = dalloc(size_t(cdiv(M, 128) * kb) * 4);
    t.sw_ch = dalloc(size_t(N) * 4);
    t.sw_blk = dalloc(size_t(cdiv(N, 128) * kb) * 4);
    td::bench::fill_random_bf16(t.x, size_t(M * K), 1.f, seed + 1, stream);
    fill_i8(t.a, size_t(M * K), seed + 2, stream);
    fill_i8(t.w8, size_t(N * K), seed + 3, stream);
    td::bench::fill_random_bf16(t.w16, size_t(N * K), 0.02f, seed + 4, stream);
    fill_scales(t.sa_tok, size_t(M), seed + 5, stream);
    fill_scales(t.sa_t128, size_t(kb * M), seed + 6, stream);
    fill_scales(t.sa_b128, size_t(cdiv(M, 128) * kb), seed + 7, stream);
    fill_scales(t.sw_ch, size_t(N), seed + 8, stream);
    fill_scales(t.sw_blk, size_t(cdiv(N, 128) * kb), seed + 9, stream);
  }
  void* out = dalloc(size_t(M * N) * 2);
  void* resid = dalloc(size_t(M * N) * 2);
  float* bias = static_cast<float*>(dalloc(size_t(N) * 4));
  float* gate = static_cast<float*>(dalloc(size_t(N) * 4));
  td::bench::fill_random_bf16(resid, size_t(M * N), 1.f, 7, stream);
  td::bench::fill_random_f32(bias, size_t(N), 0.1f, 8, stream);
  td::bench::fill_random_f32(gate, size_t(N), 0.5f, 9, stream);
  TD_BENCH_CUDA(cudaStreamSynchronize(stream));
  auto S = [&](int i) -> const Set& { return s[size_t(i % sets)]; };

  nlohmann::json j;
  j["M"] = M;
  j["K"] = K;
  j["N"] = N;
  j["gflop"] = flop / 1e9;
  j["expected_ms_at_1500_tops"] = flop / 1500e12 * 1e3;
  j["input_sets"] = sets;

  auto record = [&](const std::string& name, const std::function<void(int)>& fn) -> double {
    if (!opt.filter.empty() && name != "cublas_bf16" && name.find(opt.filter) == std::string::npos) return 0;
    const Timing t = td::bench::time_cuda(fn, stream, warmup, reps);
    nlohmann::json r;
    r["median_ms"] = t.median_ms;
    r["min_ms"] = t.min_ms;
    r["tops"] = flop / (t.median_ms * 1e-3) / 1e12;
    if (j.contains("cublas_bf16")) r["speedup_vs_bf16"] = j["cublas_bf16"]["median_ms"].get<double>() / t.median_ms;
    j[name] = r;
    return t.median_ms;
  };

  const float one = 1.f, zero = 0.f;
  TD_CUBLAS(cublasSetStream(blas, stream));
  record("cublas_bf16", [&](int i) {
    // row-major out[M,N] = X[M,K] W[N,K]^T  ==  column-major out^T = W^T(op T) X^T
    TD_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, S(i).w16, CUDA_R_16BF,
                           int(K), S(i).x, CUDA_R_16BF, int(K), &zero, out, CUDA_R_16BF, int(N),
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });

  auto operands = [&](const Set& t) {
    td::kernels::Int8GemmOperands op;
    op.M = M, op.N = N, op.K = K;
    op.a = static_cast<const int8_t*>(t.a), op.lda = K;
    op.w = static_cast<const int8_t*>(t.w8), op.ldw = K;
    op.out = out, op.ldo = N;
    return op;
  };
  auto post = [&](const Set& t) {
    td::kernels::Int8GemmPostScaleArgs a;
    a.op = operands(t);
    a.a_scale = static_cast<const float*>(t.sa_tok);
    a.w_scale = static_cast<const float*>(t.sw_ch);
    return a;
  };
  auto block = [&](const Set& t, bool token) {
    td::kernels::Int8GemmBlockScaledArgs a;
    a.op = operands(t);
    a.a_scale = static_cast<const float*>(token ? t.sa_t128 : t.sa_b128);
    a.a_scale_kind = token ? td::kernels::ActScale::Token128 : td::kernels::ActScale::Block128;
    a.ld_a_scale = token ? M : kb;
    a.w_scale = static_cast<const float*>(t.sw_blk);
    a.ld_w_scale = kb;
    return a;
  };
  auto with_epilogue = [&](td::kernels::Int8GemmOperands& op) {
    op.epilogue.bias = bias;
    if (std::strcmp(sh.epilogue, "gelu") == 0) {
      op.epilogue.activation = td::kernels::GemmActivation::GeluTanh;
    } else {
      op.epilogue.residual = static_cast<const uint16_t*>(resid);
      op.epilogue.ld_residual = N;
      op.epilogue.gate = gate;
      op.epilogue.ld_gate = N;
      op.epilogue.rows_per_batch = M;
    }
  };
  const auto BF = ElemType::BF16;

  if (sm90) {
    record("post_scale_sm90", [&](int i) { require_ok(post_scale_sm90(post(S(i)), stream), "post_scale_sm90"); });
    // The same call on the full epilogue instance (the lean one, which the
    // call above runs, is the same bits; TURBODIFF_GEMM_SM90_LEAN=0).
    setenv("TURBODIFF_GEMM_SM90_LEAN", "0", 1);
    record("post_scale_sm90_full_epilogue_tree",
           [&](int i) { require_ok(post_scale_sm90(post(S(i)), stream), "post_scale_sm90 (full tree)"); });
    unsetenv("TURBODIFF_GEMM_SM90_LEAN");
    record("post_scale_sm90_quant", [&](int i) {
      const Set& t = S(i);
      require_ok(td::kernels::quantize_per_row_cuda(BF, t.x, M, K, K, static_cast<int8_t*>(t.a), K,
                                                    static_cast<float*>(t.sa_tok), stream),
                 "quantize_per_row_cuda");
      require_ok(post_scale_sm90(post(t), stream), "post_scale_sm90");
    });
    record("post_scale_sm90_epilogue", [&](int i) {
      auto a = post(S(i));
      with_epilogue(a.op);
      require_ok(post_scale_sm90(a, stream), "post_scale_sm90 epilogue");
    });
    record("block_scaled_sm90_token128", [&](int i) {
      require_ok(block_scaled_sm90(block(S(i), true), stream), "block_scaled_sm90");
    });
    record("block_scaled_sm90_token128_quant", [&](int i) {
      const Set& t = S(i);
      require_ok(td::kernels::quantize_token128_cuda(BF, t.x, M, K, K, static_cast<int8_t*>(t.a), K,
                                                     static_cast<float*>(t.sa_t128), M, stream),
                 "quantize_token128_cuda");
      require_ok(block_scaled_sm90(block(t, true), stream), "block_scaled_sm90");
    });
    record("block_scaled_sm90_block128", [&](int i) {
      require_ok(block_scaled_sm90(block(S(i), false), stream), "block_scaled_sm90");
    });
    record("block_scaled_sm90_token128_epilogue", [&](int i) {
      auto a = block(S(i), true);
      with_epilogue(a.op);
      require_ok(block_scaled_sm90(a, stream), "block_scaled_sm90 epilogue");
    });
    for (const char* mode : {"inline", "deferred"}) {
      setenv("TURBODIFF_GEMM_SM90_BLOCK_EPI", mode, 1);
      record(std::string("block_scaled_sm90_token128_") + mode, [&](int i) {
        require_ok(block_scaled_sm90(block(S(i), true), stream), "block_scaled_sm90");
      });
      record(std::string("block_scaled_sm90_token128_epilogue_") + mode, [&](int i) {
        auto a = block(S(i), true);
        with_epilogue(a.op);
        require_ok(block_scaled_sm90(a, stream), "block_scaled_sm90 epilogue");
      });
      unsetenv("TURBODIFF_GEMM_SM90_BLOCK_EPI");
    }
    record("block_scaled_sm90_block128_quant", [&](int i) {
      const Set& t = S(i);
      require_ok(td::kernels::quantize_block128_cuda(BF, t.x, M, K, K, static_cast<int8_t*>(t.a), K,
                                                     static_cast<float*>(t.sa_b128), stream),
                 "quantize_block128_cuda");
      require_ok(block_scaled_sm90(block(t, false), stream), "block_scaled_sm90");
    });
  }
  record("post_scale_mma", [&](int i) { require_ok(td::kernels::int8_gemm_post_scale_mma(post(S(i)), stream), "post_scale_mma"); });
  record("block_scaled_mma_token128", [&](int i) {
    require_ok(td::kernels::int8_gemm_block_scaled_mma(block(S(i), true), stream), "block_scaled_mma");
  });

  for (Set& t : s)
    for (void* p : {t.x, t.a, t.w8, t.w16, t.sa_tok, t.sa_t128, t.sa_b128, t.sw_ch, t.sw_blk}) cudaFree(p);
  for (void* p : {out, resid, static_cast<void*>(bias), static_cast<void*>(gate)}) cudaFree(p);
  return j;
}

// Multiplies every element of `cols` columns (spread over [0, K)) of X by `factor`:
// Wan-like activation outliers (a few channels ~50x the rest).
__global__ void outlier_columns_kernel(__nv_bfloat16* x, int64_t M, int64_t K, int stride, float factor) {
  const int64_t n = M * (K / stride);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / (K / stride), c = (i % (K / stride)) * stride + stride / 2;
    x[m * K + c] = __float2bfloat16(__bfloat162float(x[m * K + c]) * factor);
  }
}

struct AccuracyError {
  double rel_l2 = 0, cosine = 0;
};
// out (bf16) against ref (fp32), both [M, N] on the device; reduced on the host.
AccuracyError compare_to(const void* out_bf16, const float* ref, int64_t n) {
  std::vector<uint16_t> o(static_cast<size_t>(n));
  std::vector<float> r(static_cast<size_t>(n));
  TD_BENCH_CUDA(cudaMemcpy(o.data(), out_bf16, size_t(n) * 2, cudaMemcpyDeviceToHost));
  TD_BENCH_CUDA(cudaMemcpy(r.data(), ref, size_t(n) * 4, cudaMemcpyDeviceToHost));
  double d2 = 0, r2 = 0, o2 = 0, dot = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    uint32_t bits = uint32_t(o[i]) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    const double d = double(v) - double(r[i]);
    d2 += d * d;
    r2 += double(r[i]) * r[i];
    o2 += double(v) * v;
    dot += double(v) * r[i];
  }
  return {std::sqrt(d2 / r2), dot / std::sqrt(o2 * r2)};
}

// Accuracy of each W8A8 scheme against the BF16 linear (cuBLAS, bf16 inputs,
// fp32 output) on one shape: X ~ N(0, 1) bf16 with 1 channel in 128 scaled
// 50x, W ~ N(0, 0.02) bf16; each scheme quantizes X and W with its own
// quantizers (quant_per_row / quant_token128 / quant_block128), then runs its
// sm90 GEMM. Also reports the bf16-output rounding floor (cuBLAS bf16 out).
nlohmann::json accuracy(int64_t M, int64_t K, int64_t N, cublasHandle_t blas, cudaStream_t stream) {
  const int64_t kb = cdiv(K, 128);
  void* x = dalloc(size_t(M * K) * 2);
  void* w = dalloc(size_t(N * K) * 2);
  td::bench::fill_random_bf16(x, size_t(M * K), 1.f, 1234, stream);
  td::bench::fill_random_bf16(w, size_t(N * K), 0.02f, 4321, stream);
  outlier_columns_kernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(x), M, K, 128, 50.f);
  TD_BENCH_CUDA(cudaGetLastError());
  float* ref = static_cast<float*>(dalloc(size_t(M * N) * 4));
  void* out = dalloc(size_t(M * N) * 2);
  auto* a8 = static_cast<int8_t*>(dalloc(size_t(M * K)));
  auto* w8 = static_cast<int8_t*>(dalloc(size_t(N * K)));
  auto* sa = static_cast<float*>(dalloc(size_t(kb * M + cdiv(M, 128) * kb + M) * 4));
  auto* sw = static_cast<float*>(dalloc(size_t(cdiv(N, 128) * kb + N) * 4));
  const float one = 1.f, zero = 0.f;
  TD_CUBLAS(cublasSetStream(blas, stream));
  TD_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, w, CUDA_R_16BF, int(K), x,
                         CUDA_R_16BF, int(K), &zero, ref, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  TD_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, w, CUDA_R_16BF, int(K), x,
                         CUDA_R_16BF, int(K), &zero, out, CUDA_R_16BF, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  TD_BENCH_CUDA(cudaStreamSynchronize(stream));
  nlohmann::json j;
  j["shape"] = {{"M", M}, {"K", K}, {"N", N}};
  j["data"] = "X ~ N(0,1) bf16 with every 128th channel x50; W ~ N(0,0.02) bf16; reference: cuBLAS bf16 inputs, fp32 output";
  auto put = [&](const char* name) {
    TD_BENCH_CUDA(cudaStreamSynchronize(stream));
    const AccuracyError e = compare_to(out, ref, M * N);
    j[name] = {{"rel_l2", e.rel_l2}, {"cosine", e.cosine}};
  };
  put("cublas_bf16_output_rounding");
  td::kernels::Int8GemmOperands op;
  op.M = M, op.N = N, op.K = K, op.a = a8, op.lda = K, op.w = w8, op.ldw = K, op.out = out, op.ldo = N;
  const auto BF = ElemType::BF16;
  {  // post-scale: per-token activation, per-channel weight
    require_ok(td::kernels::quantize_per_row_cuda(BF, x, M, K, K, a8, K, sa, stream), "quantize_per_row_cuda");
    require_ok(td::kernels::quantize_per_row_cuda(BF, w, N, K, K, w8, K, sw, stream), "quantize_per_row_cuda");
    td::kernels::Int8GemmPostScaleArgs args;
    args.op = op, args.a_scale = sa, args.w_scale = sw;
    require_ok(post_scale_sm90(args, stream), "post_scale_sm90");
    put("post_scale_per_token_per_channel");
  }
  require_ok(td::kernels::quantize_block128_cuda(BF, w, N, K, K, w8, K, sw, stream), "quantize_block128_cuda");
  {  // block-scaled, 1x128 activation groups, 128x128 weight blocks
    require_ok(td::kernels::quantize_token128_cuda(BF, x, M, K, K, a8, K, sa, M, stream), "quantize_token128_cuda");
    td::kernels::Int8GemmBlockScaledArgs args;
    args.op = op, args.a_scale = sa, args.a_scale_kind = td::kernels::ActScale::Token128, args.ld_a_scale = M;
    args.w_scale = sw, args.ld_w_scale = kb;
    require_ok(block_scaled_sm90(args, stream), "block_scaled_sm90");
    put("block_scaled_token128");
  }
  {  // TurboDiffusion's format: 128x128 blocks on both
    require_ok(td::kernels::quantize_block128_cuda(BF, x, M, K, K, a8, K, sa, stream), "quantize_block128_cuda");
    td::kernels::Int8GemmBlockScaledArgs args;
    args.op = op, args.a_scale = sa, args.a_scale_kind = td::kernels::ActScale::Block128, args.ld_a_scale = kb;
    args.w_scale = sw, args.ld_w_scale = kb;
    require_ok(block_scaled_sm90(args, stream), "block_scaled_sm90");
    put("block_scaled_block128_turbodiffusion");
  }
  for (void* p : {x, w, static_cast<void*>(ref), out, static_cast<void*>(a8), static_cast<void*>(w8),
                  static_cast<void*>(sa), static_cast<void*>(sw)})
    cudaFree(p);
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--filter" && i + 1 < argc) {
      opt.filter = argv[++i];
    } else if (a == "--small-only") {
      opt.small_only = true;
    } else if (a == "--large-only") {
      opt.large_only = true;
    } else {
      std::fprintf(stderr, "usage: bench_gemm [--filter SUBSTR] [--small-only | --large-only]\n  unknown argument '%s'\n",
                   a.c_str());
      return 2;
    }
  }
  cudaStream_t stream;
  TD_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t blas;
  TD_CUBLAS(cublasCreate(&blas));
  void* blas_ws = dalloc(size_t(64) << 20);
  TD_CUBLAS(cublasSetWorkspace(blas, blas_ws, size_t(64) << 20));

  int dev = 0, major = 0, minor = 0;
  TD_BENCH_CUDA(cudaGetDevice(&dev));
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
#if TURBODIFF_HAVE_SM90
  const bool sm90 = major == 9 && minor == 0;
#else
  const bool sm90 = false;  // this build has no sm_90a kernels
#endif

  const Shape large[] = {{"1.3B_qkv", 32760, 1536, 1536, "gated"},   {"1.3B_ffn1", 32760, 1536, 8960, "gelu"},
                         {"1.3B_ffn2", 32760, 8960, 1536, "gated"},  {"14B_qkv", 75600, 5120, 5120, "gated"},
                         {"14B_ffn1", 75600, 5120, 13824, "gelu"},   {"14B_ffn2", 75600, 13824, 5120, "gated"}};
  nlohmann::json j;
  j["bench"] = "gemm";
  j["device"] = td::bench::device_json();
  j["baseline"] = "cublasGemmEx bf16 x bf16 -> bf16, fp32 compute, 64 MB workspace, same process";
  j["activation_quantization"] =
      "standalone quant_per_row_cuda / quant_token128_cuda / quant_block128_cuda from bf16 X[M,K], timed with the GEMM";
  if (!sm90) j["note"] = "not a cc 9.0 GPU: only the portable mma.sync kernels run";
  nlohmann::json shapes;
  for (const Shape& sh : large) {
    if (!opt.small_only) {
      std::fprintf(stderr, "bench_gemm: %s M=%lld\n", sh.name, static_cast<long long>(sh.M));
      shapes[std::string(sh.name)] = bench_shape(sh, opt, blas, stream, sm90);
    }
    if (!opt.large_only) {
      Shape small = sh;
      small.M = 512;
      std::fprintf(stderr, "bench_gemm: %s M=512\n", sh.name);
      shapes[std::string(sh.name) + "_M512"] = bench_shape(small, opt, blas, stream, sm90);
    }
  }
  j["shapes"] = shapes;
  if (sm90 && opt.filter.empty()) j["accuracy_vs_bf16"] = accuracy(32760, 1536, 1536, blas, stream);
  std::printf("%s\n", j.dump(1).c_str());
  cudaFree(blas_ws);
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  return 0;
}
