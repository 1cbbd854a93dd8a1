#include "ops/sla.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "ops/common.h"

// The SageSLA sparse branch is the SageAttention-style kernel (ops/sage_attention.h).
#include "ops/sage_attention.h"
#if TURBODIFF_HAVE_CUDA
#include "kernels/sage_attention/sage_prepass.h"
#endif

namespace td::ops {
namespace {

constexpr const char* kOp = "sla";

void check_operand(const Tensor& t, const char* what) {
  TD_CHECK(t.defined() && t.dim() == 4, Shape, kOp, ": ", what, " must be 4-D [B, L, heads, head_dim], got ",
           t.defined() ? t.desc() : std::string("undefined"));
  TD_CHECK(dtype_is_floating(t.dtype()), DType, kOp, ": ", what, " ", t.desc(), " must be floating-point");
}

// fp32 with head_dim contiguous, as [B, L, H, D] strides (batch, head, token).
Tensor as_f32(const Tensor& t) {
  Tensor f = t.dtype() == DType::F32 ? t : t.to(DType::F32);
  if (f.size(3) != 1 && f.strides()[3] != 1) f = f.contiguous();
  for (int64_t d = 0; d < 3; ++d)
    if (f.strides()[size_t(d)] < 0) return f.contiguous();
  return f;
}

#if TURBODIFF_HAVE_CUDA
// A second stream per device for the linear branch's K/V half (created once, kept).
void* aux_stream(int device) {
  static std::mutex mu;
  static std::map<int, cuda::Stream*> streams;
  std::lock_guard<std::mutex> lock(mu);
  cuda::Stream*& s = streams[device];
  if (!s) s = new cuda::Stream(device);
  return s->native();
}
#endif

kernels::SlaProblem problem(const Tensor& q, const Tensor& k, const Tensor& v, const SlaOptions& options) {
  kernels::SlaProblem p;
  p.batch = q.size(0);
  p.heads = q.size(2);
  p.len = q.size(1);
  p.head_dim = q.size(3);
  p.q = attention_strides(q);
  p.k = attention_strides(k);
  p.v = attention_strides(v);
  p.o = kernels::attn_contiguous_strides(kernels::AttnLayout::BLHD, p.heads, p.len, p.head_dim);
  p.scale = options.scale.value_or(float(1.0 / std::sqrt(double(p.head_dim))));
  p.block_q = options.block_q;
  p.block_k = options.block_k;
  p.topk = options.topk;
  p.feature_map = options.feature_map;
  p.topk_algo = options.topk_algo;
  p.score_kernel = options.score_kernel;
  p.linear_kernels = options.linear_kernels;
  // The fused pipeline runs unless turned off (options.fused = false, or
  // TD_SLA_FUSED=0 with options.fused unset: see sla_cuda), so its Auto
  // choices below hold for the model's calls too (options.fused unset).
  const char* fused_env = std::getenv("TD_SLA_FUSED");
  const bool fused_pipeline = options.fused ? *options.fused : !(fused_env && std::strcmp(fused_env, "0") == 0);
  if (fused_pipeline) {
    if (p.score_kernel == kernels::SlaScoreKernel::Auto) p.score_kernel = kernels::SlaScoreKernel::Tiled;
    if (p.linear_kernels == kernels::SlaLinearKernels::Auto) {
      // TD_SLA_LINEAR=persist picks the persistent apply (bit-identical to
      // Staged), else Staged. The persistent one had won at 1x40x75600 (session
      // 5); since the Q half forms φ(Q) in the mma fragments (session 12) the
      // Staged apply is the faster at both measured shapes on the H200:
      // 0.116-0.118 against 0.124 ms at 1x12x32760, 0.825 against 1.002 ms at
      // 1x40x75600 (bench_sla `sagesla_linear_apply_staged` / `_persist`).
      const char* env = std::getenv("TD_SLA_LINEAR");
      const bool persist = env && std::strcmp(env, "persist") == 0;
      p.linear_kernels = persist ? kernels::SlaLinearKernels::StagedPersist : kernels::SlaLinearKernels::Staged;
    }
  }
  return p;
}

#if TURBODIFF_HAVE_CUDA
// SageSLA's fused pipeline (SlaOptions::fused), on the current stream:
//   sage_prepare_cuda: K/V statistics, K mean and V scales, then the quantize
//     pass, which also writes Σ q per 64 rows and Σ (k - km) per 64 keys;
//   sla_block_select_from_sums_cuda: pooled scores from those sums (Tiled
//     GEMM) and the top-k into `lut`;
//   sage_attend_cuda: the block-sparse kernel on the quantized workspace.
// Predicted at 1x12x32760 (H200, ~3.5 TB/s), against the default's selection
// (pooling 57 us reading Q and K, K mean 10 us, score 75 us, top-k 26 us):
// the quantize pass already reads Q and K (302 MB with V) and writes 150 MB,
// ~130 us either way; the sums add 2 x 12 x 512 x 128 x 4 B = 6 MB of writes
// (~2 us) and a shared-memory reduction per CTA; selection is then the Tiled
// score (~10 us, 6 MB of sums read) + top-k (26 us): ~0.04 ms instead of
// 0.18 ms. At 1x40x75600: pooling ~0.44 ms and score ~1.3 ms go, Tiled score
// ~0.15 ms + top-k: ~0.35 ms instead of 2.0 ms.
// kv_stats_ws (TD_SLA_FUSED=2 with proj_l): first the linear branch's K/V half
// in line with the Staged kernels, which also writes the sage K mean and V
// scales into the sage workspace (sla_linear_prepare_stats_cuda), so the sage
// pre-pass skips its statistics pass: K and V are read once for both instead of
// twice (-201 MB, ~0.06 ms at 1x12x32760; -1.5 GB, ~0.45 ms at 1x40x75600),
// and the K/V half is no longer competing from a second stream. The caller
// then adds the Q half from *kv_stats_ws.
Tensor sagesla_fused(const kernels::SlaProblem& p, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& lut,
                     int64_t n_sel, const std::function<void(kernels::Status, const char*)>& check,
                     Tensor* kv_stats_ws, const Tensor& proj_weight, const Tensor& proj_bias,
                     kernels::ElemType proj_type) {
  void* stream = cuda::current_stream();
  kernels::AttnProblem ap;
  ap.batch = p.batch;
  ap.heads = p.heads;
  ap.len_q = ap.len_kv = p.len;
  ap.head_dim = p.head_dim;
  ap.q = p.q;
  ap.k = p.k;
  ap.v = p.v;
  ap.o = p.o;
  ap.scale = p.scale;
  ap.qkv_type = ap.o_type = kernels::ElemType::BF16;
  kernels::SageSparse sp;
  sp.lut = lut.data<int32_t>();
  sp.n_sel = n_sel;
  sp.block_q = p.block_q;
  sp.block_k = p.block_k;
  // The backend ops::sage_attention's Auto would take: sm_90a where it takes the problem, else portable.
  kernels::SageBackend be = kernels::SageBackend::Sm90;
  if (kernels::sage_attention_supports(ap, &sp, be) != kernels::Status::Ok) be = kernels::SageBackend::Portable;
  auto check_attn = [&](kernels::Status s, const char* what) {
    if (s != kernels::Status::Ok) check_status(s, kOp, cat(q.desc(), ": ", what, ": ", kernels::attention_last_error()));
  };
  check_attn(kernels::sage_attention_supports(ap, &sp, be), "sage kernel");
  const size_t sage_bytes = kernels::sage_attention_workspace_size(ap, be);
  Tensor sage_ws = Tensor::empty({int64_t(sage_bytes)}, DType::U8, q.device());
  const int64_t nb = kernels::sage_sum64_blocks(p.len), bh = p.batch * p.heads;
  Tensor sums = Tensor::empty({2, bh, nb, p.head_dim}, DType::F32, q.device());
  kernels::SagePoolSums ps;
  ps.q_sum64 = sums.data<float>();
  ps.k_sum64 = sums.data<float>() + bh * nb * p.head_dim;
  if (kv_stats_ws) {
    const kernels::SageStatsSlots slots = kernels::sage_stats_slots(ap, be, sage_ws.raw_data());
    kernels::SlaSageStats stats;
    stats.km = slots.km;
    stats.vscale = slots.vscale;
    stats.vinv = slots.vinv;
    stats.defer_projection = true;  // sla_cuda runs it after the sparse kernel (sla_linear_project_apply_cuda)
    check(kernels::sla_linear_prepare_stats_cuda(p, k.raw_data(), v.raw_data(), proj_weight.raw_data(),
                                                 proj_bias.raw_data(), proj_type, stats, kv_stats_ws->raw_data(),
                                                 size_t(kv_stats_ws->numel()), stream),
          "linear branch (K/V half with the sage statistics)");
    ps.stats_given = true;
  }
  check_attn(kernels::sage_prepare_cuda(ap, q.raw_data(), k.raw_data(), v.raw_data(), &sp, be, ps,
                                        sage_ws.raw_data(), sage_bytes, stream),
             "sage pre-pass with block sums");
  {
    const size_t ws_bytes = kernels::sla_block_select_workspace_size(p);
    Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, q.device());
    check(kernels::sla_block_select_from_sums_cuda(p, ps.q_sum64, nb, ps.k_sum64, nb, nullptr, lut.data<int32_t>(),
                                                   ws.raw_data(), ws_bytes, stream),
          "block selection from the sage block sums");
  }
  Tensor o = Tensor::empty({p.batch, p.len, p.heads, p.head_dim}, DType::BF16, q.device());
  check_attn(kernels::sage_attend_cuda(ap, o.raw_data(), nullptr, &sp, be, sage_ws.raw_data(), sage_bytes, stream),
             "sage block-sparse kernel");
  return o;
}
#endif

// CUDA tensors: BF16 in and out. `sla` (128 x 64 blocks): kernels::sla_cuda.
// `sagesla` (any other block shape the sage kernel takes): block selection,
// the SageAttention-style sparse kernel (ops::sage_attention with the LUT),
// then the linear branch added onto its output.
Tensor sla_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& proj_weight, const Tensor& proj_bias,
                const SlaOptions& options, std::optional<DType> out_dtype) {
#if TURBODIFF_HAVE_CUDA
  const std::string ctx = cat("q ", q.desc());
  TD_CHECK(q.dtype() == DType::BF16 && k.dtype() == DType::BF16 && v.dtype() == DType::BF16 &&
               out_dtype.value_or(DType::BF16) == DType::BF16,
           Unsupported, kOp, ": the CUDA kernels take bf16 q/k/v and output; got ", ctx,
           out_dtype ? cat(", out ", dtype_name(*out_dtype)) : std::string(),
           ". Run the model in bf16 on CUDA, or on the CPU for f32");
  for (const auto* t : {&q, &k, &v})
    TD_CHECK(t->size(3) == 1 || t->strides()[3] == 1, Shape, kOp, ": ", t->desc(),
             " must be contiguous along head_dim on CUDA");
  const int64_t D = q.size(3);
  TD_CHECK(D == 64 || D == 128, Unsupported, kOp, ": the CUDA kernels take head_dim 64 or 128 (their mma tiles), got ",
           ctx, "; run on the CPU (the fp32 reference) or use --attention original");
  kernels::ElemType proj_type = kernels::ElemType::F32;
  if (proj_weight.defined()) {
    TD_CHECK(proj_weight.shape() == Shape({D, D}) && proj_bias.shape() == Shape({D}), Shape, kOp,
             ": proj_l must be weight [", D, ", ", D, "] and bias [", D, "] for head_dim ", D, ", got ",
             proj_weight.desc(), " and ", proj_bias.desc());
    TD_CHECK(proj_weight.dtype() == proj_bias.dtype() &&
                 (proj_weight.dtype() == DType::F32 || proj_weight.dtype() == DType::BF16),
             DType, kOp, ": proj_l on CUDA must be f32 or bf16 (weight and bias alike), got ", proj_weight.desc(),
             " and ", proj_bias.desc());
    TD_CHECK(proj_weight.is_contiguous() && proj_bias.is_contiguous(), Shape, kOp, ": proj_l must be contiguous");
    proj_type = proj_weight.dtype() == DType::F32 ? kernels::ElemType::F32 : kernels::ElemType::BF16;
  }
  cuda::set_device(q.device().index);
  void* stream = cuda::current_stream();
  const kernels::SlaProblem p = problem(q, k, v, options);
  auto check = [&](kernels::Status s, const char* what) {
    if (s != kernels::Status::Ok) check_status(s, kOp, cat(ctx, ": ", what, ": ", kernels::sla_last_error()));
  };
  if (p.block_q == 128 && p.block_k == 64) {
    Tensor o = Tensor::empty({p.batch, p.len, p.heads, D}, DType::BF16, q.device());
    const size_t ws_bytes = kernels::sla_workspace_size(p);
    Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, q.device());
    check(kernels::sla_cuda(p, q.raw_data(), k.raw_data(), v.raw_data(),
                            proj_weight.defined() ? proj_weight.raw_data() : nullptr,
                            proj_bias.defined() ? proj_bias.raw_data() : nullptr, proj_type, o.raw_data(), nullptr,
                            nullptr, nullptr, ws.raw_data(), ws_bytes, stream),
          "sla");
    return o;
  }
  // SageSLA: the selection with the sage kernel's blocks, its block-sparse kernel, our linear branch.
  const int64_t n_sel = kernels::sla_selected_blocks(p.topk, p.key_blocks());
  Tensor lut = Tensor::empty({p.batch, p.heads, p.query_blocks(), n_sel}, DType::I32, q.device());
  // fused: 0 off, 1 the sage pass's block sums (TD_SLA_FUSED=1), 2 and the sage
  // statistics from the linear branch's K/V pass (with proj_l only). Level 2 is
  // the default: SageSLA at topk 0.1 in 1.89 vs 2.17 ms at 1x12x32760 and
  // 23.3 vs 25.8 ms at 1x40x75600 on the H200 (2026-11-30, bench_sla
  // `sagesla_fused_kv_total` vs `sagesla_total_radix_overlap`; GPU tests
  // passed). TD_SLA_FUSED=0 runs the earlier pipeline (also its Simple score
  // and Warp linear kernels), TD_SLA_FUSED=1 level 1.
  const char* fused_env = std::getenv("TD_SLA_FUSED");
  const int env_level = fused_env && std::string(fused_env) == "0" ? 0 : fused_env && std::string(fused_env) == "1" ? 1 : 2;
  int fused = 0;
  if (options.fused) {
    fused = *options.fused ? (options.fused_kv_stats.value_or(env_level != 1) ? 2 : 1) : 0;
  } else {
    fused = env_level;
    if (fused && options.fused_kv_stats) fused = *options.fused_kv_stats ? 2 : 1;
  }
  const bool kv_stats = fused == 2 && proj_weight.defined();
  bool overlap = false;
  if (proj_weight.defined() && !kv_stats) {  // kv_stats: the K/V half runs in line, first
    if (options.overlap_linear) {
      overlap = *options.overlap_linear;
    } else {
      // On by default: 0.03 ms at 1x12x32760 and ~1 ms at 1x40x75600 saved
      // on the H200 (2026-11-30, bench_sla), same bits (GPU tests passed).
      const char* env = std::getenv("TD_SLA_OVERLAP");
      overlap = !(env && std::string(env) == "0");
    }
  }
  // The linear branch's K/V half forked onto a second stream (it reads K and V
  // only), joined back before its Q half adds onto the sparse output.
  Tensor lin_ws;
  std::unique_ptr<cuda::Event> fork_event, join_event;
  void* join_aux = nullptr;
  if (overlap) {
    const size_t ws_bytes = kernels::sla_linear_workspace_size(p);
    lin_ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, q.device());
    void* aux = aux_stream(q.device().index);
    fork_event = std::make_unique<cuda::Event>();
    join_event = std::make_unique<cuda::Event>();
    check(kernels::sla_stream_wait(aux, stream, fork_event->native()), "fork");
    check(kernels::sla_linear_prepare_cuda(p, k.raw_data(), v.raw_data(), proj_weight.raw_data(),
                                           proj_bias.raw_data(), proj_type, lin_ws.raw_data(), ws_bytes, aux),
          "linear branch (K/V half)");
    join_aux = aux;
  }
  // If anything below throws, wait for the K/V half before lin_ws goes back to the pool.
  struct AuxGuard {
    cuda::Event* event;
    void* aux;
    ~AuxGuard() {
      if (!aux) return;
      try {
        event->record(aux);
        event->synchronize();
      } catch (...) {
      }
    }
  } guard{join_event.get(), join_aux};
  Tensor o;
  if (kv_stats) lin_ws = Tensor::empty({int64_t(kernels::sla_linear_workspace_size(p))}, DType::U8, q.device());
  if (fused) {
    o = sagesla_fused(p, q, k, v, lut, n_sel, check, kv_stats ? &lin_ws : nullptr, proj_weight, proj_bias, proj_type);
  } else {
    {
      const size_t ws_bytes = kernels::sla_block_select_workspace_size(p);
      Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, q.device());
      check(kernels::sla_block_select_cuda(p, q.raw_data(), k.raw_data(), nullptr, lut.data<int32_t>(),
                                           ws.raw_data(), ws_bytes, stream),
            "block selection");
    }
    SageAttentionOptions so;
    so.scale = p.scale;
    so.lut = lut;
    so.block_q = p.block_q;
    so.block_k = p.block_k;
    o = sage_attention(q, k, v, so, DType::BF16);
  }
  TD_CHECK(o.is_contiguous() && o.shape() == Shape({p.batch, p.len, p.heads, D}), Internal, kOp,
           ": the sage kernel returned ", o.desc(), ", expected a contiguous [B, L, H, D]");
  if (kv_stats) {
    // The projection deferred by sagesla_fused, in the sparse kernel's tail, then the Q half.
    check(kernels::sla_linear_project_apply_cuda(p, q.raw_data(), o.raw_data(), proj_weight.raw_data(),
                                                 proj_bias.raw_data(), proj_type, lin_ws.raw_data(),
                                                 size_t(lin_ws.numel()), stream),
          "linear branch (projection and Q half)");
  } else if (overlap) {
    guard.aux = nullptr;
    check(kernels::sla_stream_wait(stream, join_aux, join_event->native()), "join");
    check(kernels::sla_linear_apply_cuda(p, q.raw_data(), o.raw_data(), lin_ws.raw_data(), size_t(lin_ws.numel()),
                                         stream),
          "linear branch (Q half)");
  } else if (proj_weight.defined()) {
    const size_t ws_bytes = kernels::sla_linear_workspace_size(p);
    Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, q.device());
    check(kernels::sla_linear_add_cuda(p, q.raw_data(), k.raw_data(), v.raw_data(), proj_weight.raw_data(),
                                       proj_bias.raw_data(), proj_type, o.raw_data(), ws.raw_data(), ws_bytes, stream),
          "linear branch");
  }
  return o;
#else
  (void)k, (void)v, (void)proj_weight, (void)proj_bias, (void)options, (void)out_dtype;
  fail(ErrorKind::Unsupported, kOp, ": ", q.device().str(), " tensors in a build without CUDA");
#endif
}

}  // namespace

bool sla_cuda_available(const SlaOptions& options) {
#if TURBODIFF_HAVE_CUDA
  (void)options;  // sla (128 x 64) and sagesla (the sage kernel's blocks) both run
  return true;
#else
  (void)options;
  return false;
#endif
}

Tensor sla(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& proj_weight, const Tensor& proj_bias,
           const SlaOptions& options, std::optional<DType> out_dtype) {
  check_same_device(kOp, {{"q", &q}, {"k", &k}, {"v", &v}, {"proj_l.weight", &proj_weight}, {"proj_l.bias", &proj_bias}});
  check_operand(q, "q");
  check_operand(k, "k");
  check_operand(v, "v");
  TD_CHECK(q.shape() == k.shape() && q.shape() == v.shape(), Shape, kOp,
           ": self-attention needs q, k and v of one shape, got q ", q.desc(), ", k ", k.desc(), ", v ", v.desc());
  const int64_t B = q.size(0), L = q.size(1), H = q.size(2), D = q.size(3);
  TD_CHECK(proj_weight.defined() == proj_bias.defined(), Shape, kOp,
           ": proj_l weight and bias must both be given or both be absent, got weight ",
           proj_weight.defined() ? proj_weight.desc() : std::string("undefined"), ", bias ",
           proj_bias.defined() ? proj_bias.desc() : std::string("undefined"));
  if (q.device().is_cuda()) return sla_cuda(q, k, v, proj_weight, proj_bias, options, out_dtype);
  Tensor w, bias;
  if (proj_weight.defined()) {
    const bool shapes_ok = proj_weight.shape() == Shape{D, D} && proj_bias.shape() == Shape{D};
    TD_CHECK(shapes_ok, Shape, kOp,
             ": proj_l must be weight [", D, ", ", D, "] and bias [", D, "] for head_dim ", D, ", got ",
             proj_weight.desc(), " and ", proj_bias.desc());
    w = proj_weight.to(DType::F32).contiguous();
    bias = proj_bias.to(DType::F32).contiguous();
  }
  const Tensor qf = as_f32(q), kf = as_f32(k), vf = as_f32(v);
  Tensor o = Tensor::empty({B, L, H, D}, DType::F32);

  const kernels::SlaProblem p = problem(qf, kf, vf, options);
  const kernels::Status s =
      kernels::sla_cpu(p, qf.data<float>(), kf.data<float>(), vf.data<float>(), w.defined() ? w.data<float>() : nullptr,
                       bias.defined() ? bias.data<float>() : nullptr, o.data<float>());
  if (s != kernels::Status::Ok) check_status(s, kOp, cat("q ", q.desc(), ": ", kernels::sla_last_error()));
  const DType ot = out_dtype.value_or(q.dtype());
  return ot == DType::F32 ? o : o.to(ot);
}

}  // namespace td::ops
