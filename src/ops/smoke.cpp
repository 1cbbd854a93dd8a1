#include "ops/smoke.h"

#include <cmath>
#include <sstream>

#include "core/cuda_runtime.h"
#include "kernels/attention/attention.h"
#include "kernels/quant/quant_block128.h"
#include "kernels/quant/quant_token128.h"
#include "kernels/rope/qk_norm_rope.h"
#include "kernels/rope/rope_apply.h"
#include "kernels/rope/rope_tables.h"
#include "kernels/sage_attention/sage_attention.h"
#include "kernels/t5_attention/t5_attention.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/norm.h"
#include "ops/random.h"
#include "ops/sla.h"

namespace td::ops::smoke {

Tensor host_randn(const Shape& shape, DType dtype, uint64_t seed, float stddev, float mean) {
  std::vector<float> v(size_t(shape_numel(shape)));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto uniform = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (double(s >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  };
  for (auto& x : v) x = float(mean + stddev * std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()));
  return Tensor::from_f32(shape, v, dtype);
}

SmokeResult compare(const Tensor& got, const Tensor& ref, double max_rel_l2) {
  const auto g = got.to_f32_vector();
  const auto r = ref.to_f32_vector();
  if (g.size() != r.size()) return {false, "size mismatch"};
  double d2 = 0, r2 = 0;
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) {
      ++bad;
      continue;
    }
    d2 += double(g[i] - r[i]) * double(g[i] - r[i]);
    r2 += double(r[i]) * double(r[i]);
  }
  const double rel = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
  std::ostringstream os;
  os << "rel_l2 " << rel << " (bar " << max_rel_l2 << ")";
  if (bad) os << ", " << bad << " non-finite";
  return {bad == 0 && rel <= max_rel_l2, os.str()};
}

Results norm_family(int device) {
  const Device gpu = Device::cuda(device);
  const int64_t rows = 37, dim = 192, batch = 1;
  Tensor x = host_randn({rows, dim}, DType::BF16, 1);
  Tensor y = host_randn({rows, dim}, DType::BF16, 2);
  Tensor w = host_randn({dim}, DType::F32, 3, 0.1f, 1.f);
  Tensor b = host_randn({dim}, DType::F32, 4, 0.1f);
  Tensor scale = host_randn({batch, dim}, DType::F32, 5, 0.1f);
  Tensor shift = host_randn({batch, dim}, DType::F32, 6, 0.1f);
  Tensor gate = host_randn({batch, dim}, DType::F32, 7, 0.5f);
  const double bar = 1e-2;  // bf16 outputs
  Results out;
  out.push_back({"rms_norm", guarded([&] {
    return compare(rms_norm(x.to(gpu), w.to(gpu), 1e-6f), rms_norm(x, w, 1e-6f), bar);
  })});
  out.push_back({"layer_norm", guarded([&] {
    return compare(layer_norm(x.to(gpu), w.to(gpu), b.to(gpu), 1e-6f), layer_norm(x, w, b, 1e-6f), bar);
  })});
  out.push_back({"adaln_modulate", guarded([&] {
    return compare(adaln_modulate(x.to(gpu), scale.to(gpu), shift.to(gpu), 1e-6f),
                   adaln_modulate(x, scale, shift, 1e-6f), bar);
  })});
  out.push_back({"residual_gate_norm", guarded([&] {
    Tensor xr = x.to(DType::F32), xg = xr.to(gpu);
    ResidualNormArgs a{gate, Tensor(), Tensor(), scale, shift, 1e-6f, DType::BF16};
    ResidualNormArgs ag{gate.to(gpu), Tensor(), Tensor(), scale.to(gpu), shift.to(gpu), 1e-6f, DType::BF16};
    Tensor ref = residual_gate_norm(xr, y, a);
    Tensor got = residual_gate_norm(xg, y.to(gpu), ag);
    SmokeResult r = compare(got, ref, bar);
    SmokeResult rx = compare(xg, xr, 1e-6);  // the fp32 residual written back in place
    if (!rx.ok) return SmokeResult{false, "residual: " + rx.detail};
    return r;
  })});
  return out;
}

Results elementwise_family(int device) {
  const Device gpu = Device::cuda(device);
  Tensor x = host_randn({29, 160}, DType::BF16, 11);
  Tensor v = host_randn({160}, DType::F32, 12);
  const double bar = 1e-2;
  Results out;
  out.push_back({"gelu_tanh", guarded([&] { return compare(gelu_tanh(x.to(gpu)), gelu_tanh(x), bar); })});
  out.push_back({"silu", guarded([&] { return compare(silu(x.to(gpu)), silu(x), bar); })});
  out.push_back({"add_vector", guarded([&] { return compare(add(x.to(gpu), v.to(gpu)), add(x, v), bar); })});
  return out;
}


#if TURBODIFF_HAVE_CUDA
namespace {

// Codes may differ by one step at exact .5 ties (fp32 division rounding); the
// scales must agree to fp32 rounding.
SmokeResult compare_codes(const Tensor& q_got, const Tensor& q_ref, const Tensor& s_got, const Tensor& s_ref) {
  const auto qg = q_got.to(Device::cpu()), sg = s_got.to(Device::cpu());
  const auto* a = qg.data<int8_t>();
  const auto* b = q_ref.data<int8_t>();
  int64_t off_by_one = 0, worse = 0;
  for (int64_t i = 0; i < qg.numel(); ++i) {
    const int d = std::abs(int(a[i]) - int(b[i]));
    off_by_one += d == 1;
    worse += d > 1;
  }
  double max_rel = 0;
  for (int64_t i = 0; i < sg.numel(); ++i) {
    const double r = s_ref.item_f64(i), g = sg.item_f64(i);
    max_rel = std::max(max_rel, std::fabs(g - r) / std::max(std::fabs(r), 1e-30));
  }
  std::ostringstream os;
  os << off_by_one << " codes off by one, " << worse << " further, scale rel err " << max_rel;
  return {worse == 0 && off_by_one * 1000 <= qg.numel() && max_rel <= 1e-6, os.str()};
}

}  // namespace

Results quant_family(int device) {
  const Device gpu = Device::cuda(device);
  const int64_t rows = 37, cols = 384;
  Tensor x = host_randn({rows, cols}, DType::BF16, 21);
  Tensor xg = x.to(gpu);
  Results out;
  out.push_back({"quantize_block128", guarded([&] {
    const int64_t sr = (rows + 127) / 128, sc = cols / 128;
    Tensor q = Tensor::empty({rows, cols}, DType::I8), s = Tensor::empty({sr, sc}, DType::F32);
    check_status(kernels::quantize_block128_cpu(kernels::ElemType::BF16, x.raw_data(), rows, cols, cols,
                                                q.data<int8_t>(), cols, s.data<float>()), "quantize_block128", "cpu");
    Tensor qg = Tensor::empty({rows, cols}, DType::I8, gpu), sg = Tensor::empty({sr, sc}, DType::F32, gpu);
    check_status(kernels::quantize_block128_cuda(kernels::ElemType::BF16, xg.raw_data(), rows, cols, cols,
                                                 qg.data<int8_t>(), cols, sg.data<float>(), cuda::current_stream()),
                 "quantize_block128", "cuda");
    return compare_codes(qg, q, sg, s);
  })});
  out.push_back({"quantize_token128", guarded([&] {
    const int64_t groups = cols / 128;
    Tensor q = Tensor::empty({rows, cols}, DType::I8), s = Tensor::empty({groups, rows}, DType::F32);
    check_status(kernels::quantize_token128_cpu(kernels::ElemType::BF16, x.raw_data(), rows, cols, cols,
                                                q.data<int8_t>(), cols, s.data<float>(), rows), "quantize_token128", "cpu");
    Tensor qg = Tensor::empty({rows, cols}, DType::I8, gpu), sg = Tensor::empty({groups, rows}, DType::F32, gpu);
    check_status(kernels::quantize_token128_cuda(kernels::ElemType::BF16, xg.raw_data(), rows, cols, cols,
                                                 qg.data<int8_t>(), cols, sg.data<float>(), rows, cuda::current_stream()),
                 "quantize_token128", "cuda");
    return compare_codes(qg, q, sg, s);
  })});
  return out;
}

Results rope_family(int device) {
  const Device gpu = Device::cuda(device);
  const int64_t F = 2, H = 3, W = 5, L = F * H * W;
  const int heads = 2, hd = 64, D = heads * hd;
  Results out;
  out.push_back({"qk_norm_rope", guarded([&] {
    Tensor q = host_randn({1, L, D}, DType::BF16, 31), k = host_randn({1, L, D}, DType::BF16, 32);
    Tensor wq = host_randn({D}, DType::F32, 33, 0.1f, 1.f), wk = host_randn({D}, DType::F32, 34, 0.1f, 1.f);
    const auto layout = kernels::rope_table_layout(hd, F, H, W);
    Tensor tables = Tensor::empty({layout.total}, DType::F32);
    check_status(kernels::rope_tables_cpu(hd, F, H, W, 10000.0, tables.data<float>()), "rope_tables", "cpu");
    Tensor qo = Tensor::empty({1, L, D}, DType::BF16), ko = Tensor::empty({1, L, D}, DType::BF16);
    check_status(kernels::qk_norm_rope_cpu(kernels::ElemType::BF16, q.raw_data(), D, k.raw_data(), D,
                                           wq.data<float>(), wk.data<float>(), 1, F, H, W, heads, hd, 1e-6f,
                                           tables.data<float>(), kernels::RopeOutLayout::BLHD, kernels::ElemType::BF16,
                                           qo.raw_data(), ko.raw_data()), "qk_norm_rope", "cpu");
    Tensor qg = q.to(gpu), kg = k.to(gpu), wqg = wq.to(gpu), wkg = wk.to(gpu), tg = tables.to(gpu);
    Tensor qog = Tensor::empty({1, L, D}, DType::BF16, gpu), kog = Tensor::empty({1, L, D}, DType::BF16, gpu);
    check_status(kernels::qk_norm_rope_cuda(kernels::ElemType::BF16, qg.raw_data(), D, kg.raw_data(), D,
                                            wqg.data<float>(), wkg.data<float>(), 1, F, H, W, heads, hd, 1e-6f,
                                            tg.data<float>(), kernels::RopeOutLayout::BLHD, kernels::ElemType::BF16,
                                            qog.raw_data(), kog.raw_data(), cuda::current_stream()),
                 "qk_norm_rope", "cuda");
    SmokeResult rq = compare(qog, qo, 1e-2), rk = compare(kog, ko, 1e-2);
    return SmokeResult{rq.ok && rk.ok, "q " + rq.detail + "; k " + rk.detail};
  })});
  out.push_back({"rope_apply", guarded([&] {
    const ops::PatchGrid grid{F, H, W};
    Tensor q = host_randn({1, L, D}, DType::BF16, 35);
    const Tensor tables = ops::rope_tables(hd, grid, Device::cpu());
    const Tensor ref = ops::rope_apply(q, tables, grid, heads);
    const Tensor got = ops::rope_apply(q.to(gpu), tables.to(gpu), grid, heads);
    return compare(got, ref, 1e-2);
  })});
  return out;
}

Results layout_family(int device) {
  const Device gpu = Device::cuda(device);
  Results out;
  out.push_back({"patchify", guarded([&] {
    const Tensor lat = host_randn({1, 16, 3, 6, 10}, DType::F32, 51);
    const Tensor ref = ops::patchify(lat, 1, 2, 2, DType::BF16);
    return compare(ops::patchify(lat.to(gpu), 1, 2, 2, DType::BF16), ref, 1e-6);
  })});
  out.push_back({"unpatchify", guarded([&] {
    const Tensor tok = host_randn({1, 45, 64}, DType::F32, 52);
    const Tensor ref = ops::unpatchify(tok, 3, 6, 10, 1, 2, 2);
    return compare(ops::unpatchify(tok.to(gpu), 3, 6, 10, 1, 2, 2), ref, 1e-6);
  })});
  out.push_back({"random_fill", guarded([&] {
    Tensor h = Tensor::empty({1001}, DType::BF16), d = Tensor::empty({1001}, DType::BF16, gpu);
    ops::random_fill_(h, 7, 3, -1.f, 1.f);
    ops::random_fill_(d, 7, 3, -1.f, 1.f);
    return compare(d, h, 0.0);
  })});
  return out;
}

Results attention_family(int device) {
  const Device gpu = Device::cuda(device);
  const int64_t B = 1, Hh = 2, Lq = 77, Lk = 65, D = 64;
  const auto p = kernels::AttnProblem::make(kernels::AttnLayout::BLHD, B, Hh, Lq, Lk, D);
  Tensor q = host_randn({B, Lq, Hh, D}, DType::BF16, 41), k = host_randn({B, Lk, Hh, D}, DType::BF16, 42),
         v = host_randn({B, Lk, Hh, D}, DType::BF16, 43);
  Tensor ref = Tensor::empty({B, Lq, Hh, D}, DType::BF16);
  Results out;
  const kernels::Status sref = kernels::attention_cpu(p, q.raw_data(), k.raw_data(), v.raw_data(), ref.raw_data(), nullptr);
  if (sref != kernels::Status::Ok) {
    out.push_back({"cpu_reference", {false, kernels::attention_last_error()}});
    return out;
  }
  Tensor qg = q.to(gpu), kg = k.to(gpu), vg = v.to(gpu);
  out.push_back({"flash", guarded([&] {
    Tensor o = Tensor::empty({B, Lq, Hh, D}, DType::BF16, gpu);
    const auto s = kernels::attention_flash_cuda(p, qg.raw_data(), kg.raw_data(), vg.raw_data(), o.raw_data(), nullptr,
                                                 cuda::current_stream());
    if (s != kernels::Status::Ok) return SmokeResult{false, kernels::attention_last_error()};
    return compare(o, ref, 1e-2);
  })});
#if TURBODIFF_HAVE_CUDNN
  out.push_back({"cudnn", guarded([&] {
    size_t ws = 0;
    auto s = kernels::attention_cudnn_workspace_size(p, false, &ws);
    if (s != kernels::Status::Ok) return SmokeResult{false, kernels::attention_last_error()};
    Tensor w = Tensor::empty({int64_t(ws)}, DType::U8, gpu);
    Tensor o = Tensor::empty({B, Lq, Hh, D}, DType::BF16, gpu);
    s = kernels::attention_cudnn(p, qg.raw_data(), kg.raw_data(), vg.raw_data(), o.raw_data(), nullptr,
                                 ws ? w.raw_data() : nullptr, ws, cuda::current_stream());
    if (s != kernels::Status::Ok) return SmokeResult{false, kernels::attention_last_error()};
    return compare(o, ref, 1e-2);
  })});
#endif
  return out;
}

Results sage_family(int device) {
  // Dense and 64x128 block-sparse on every backend this device runs, against
  // the CPU simulation of the same quantization.
  const Device gpu = Device::cuda(device);
  const int64_t B = 1, Hh = 2, L = 200, D = 128;
  const auto p = kernels::AttnProblem::make(kernels::AttnLayout::BLHD, B, Hh, L, L, D);
  Tensor q = host_randn({B, L, Hh, D}, DType::BF16, 61), k = host_randn({B, L, Hh, D}, DType::BF16, 62),
         v = host_randn({B, L, Hh, D}, DType::BF16, 63);
  const int64_t QB = (L + 63) / 64, n_sel = 1;
  Tensor lut = Tensor::empty({B, Hh, QB, n_sel}, DType::I32);
  for (int64_t i = 0; i < B * Hh * QB; ++i) lut.data<int32_t>()[i] = int32_t(i % 2);
  Tensor qg = q.to(gpu), kg = k.to(gpu), vg = v.to(gpu), lg = lut.to(gpu);
  Results out;
  for (const auto be : {kernels::SageBackend::Portable, kernels::SageBackend::Sm90}) {
    const char* name = be == kernels::SageBackend::Sm90 ? "sm90" : "portable";
    for (const bool sparse : {false, true}) {
      const kernels::SageSparse hs{lut.data<int32_t>(), n_sel, 64, 128}, ds{lg.data<int32_t>(), n_sel, 64, 128};
      if (kernels::sage_attention_supports(p, sparse ? &ds : nullptr, be) != kernels::Status::Ok) {
        if (be == kernels::SageBackend::Sm90) continue;  // not built or not a Hopper GPU
        out.push_back({name, {false, kernels::attention_last_error()}});
        continue;
      }
      out.push_back({std::string(name) + (sparse ? "_sparse" : ""), guarded([&] {
        Tensor ref = Tensor::empty({B, L, Hh, D}, DType::BF16);
        check_status(kernels::sage_attention_cpu(p, q.raw_data(), k.raw_data(), v.raw_data(), ref.raw_data(), nullptr,
                                                 sparse ? &hs : nullptr, be),
                     "sage_attention", "cpu");
        const size_t ws_bytes = kernels::sage_attention_workspace_size(p, be);
        Tensor w = Tensor::empty({int64_t(ws_bytes)}, DType::U8, gpu);
        Tensor o = Tensor::empty({B, L, Hh, D}, DType::BF16, gpu);
        const auto s = kernels::sage_attention_cuda(p, qg.raw_data(), kg.raw_data(), vg.raw_data(), o.raw_data(),
                                                    nullptr, sparse ? &ds : nullptr, be, w.raw_data(), ws_bytes,
                                                    cuda::current_stream());
        if (s != kernels::Status::Ok) return SmokeResult{false, kernels::attention_last_error()};
        return compare(o, ref, 1e-2);
      })});
    }
  }
  return out;
}

namespace {
// The whole SLA layer on the GPU against the CPU reference: 300 tokens, 2
// heads, head_dim 128, topk 0.2, a random proj_l.
SmokeResult sla_layer_smoke(int device, int64_t block_q, int64_t block_k, double max_rel_l2) {
  const Device gpu = Device::cuda(device);
  const int64_t B = 1, L = 300, Hh = 2, D = 128;
  Tensor q = host_randn({B, L, Hh, D}, DType::BF16, 71, 1.f, 0.f), k = host_randn({B, L, Hh, D}, DType::BF16, 72, 1.f, 0.5f),
         v = host_randn({B, L, Hh, D}, DType::BF16, 73, 1.f, 0.f);
  Tensor w = host_randn({D, D}, DType::F32, 74, 0.1f, 0.f), b = host_randn({D}, DType::F32, 75, 0.1f, 0.f);
  SlaOptions so;
  so.topk = 0.2;
  so.block_q = block_q;
  so.block_k = block_k;
  const Tensor ref = sla(q, k, v, w, b, so, DType::F32);
  const Tensor got = sla(q.to(gpu), k.to(gpu), v.to(gpu), w.to(gpu), b.to(gpu), so);
  return compare(got, ref, max_rel_l2);
}
}  // namespace

Results sla_family(int device) {
  return {{"sla", guarded([&] { return sla_layer_smoke(device, 128, 64, 1e-2); })}};
}

Results sagesla_family(int device) {
  return {{"sagesla", guarded([&] { return sla_layer_smoke(device, 64, 128, 5e-2); })}};
}

Results t5_attention_family(int device) {
  const Device gpu = Device::cuda(device);
  const int64_t B = 1, L = 33, H = 2, D = 16, buckets = 8;
  Tensor q = host_randn({B, L, H, D}, DType::F32, 51), k = host_randn({B, L, H, D}, DType::F32, 52),
         v = host_randn({B, L, H, D}, DType::F32, 53), table = host_randn({buckets, H}, DType::F32, 54);
  Tensor bucket = Tensor::empty({2 * L - 1}, DType::I32), mask = Tensor::empty({B, L}, DType::I32);
  for (int64_t i = 0; i < 2 * L - 1; ++i) bucket.data<int32_t>()[i] = int32_t((i * 5) % buckets);
  for (int64_t j = 0; j < L; ++j) mask.data<int32_t>()[j] = j < L - 3;  // the last keys are padding
  Results out;
  out.push_back({"t5_attention", guarded([&] {
    Tensor ref = Tensor::empty({B, L, H, D}, DType::F32);
    kernels::T5AttentionArgs a{q.raw_data(), k.raw_data(), v.raw_data(), kernels::ElemType::F32, table.data<float>(),
                               bucket.data<int32_t>(), mask.data<int32_t>(), ref.raw_data(), kernels::ElemType::F32,
                               B, L, H, D, buckets};
    check_status(kernels::t5_attention_cpu(a), "t5_attention", "cpu");
    Tensor qg = q.to(gpu), kg = k.to(gpu), vg = v.to(gpu), tg = table.to(gpu), bg = bucket.to(gpu), mg = mask.to(gpu);
    Tensor o = Tensor::empty({B, L, H, D}, DType::F32, gpu);
    kernels::T5AttentionArgs g{qg.raw_data(), kg.raw_data(), vg.raw_data(), kernels::ElemType::F32, tg.data<float>(),
                               bg.data<int32_t>(), mg.data<int32_t>(), o.raw_data(), kernels::ElemType::F32,
                               B, L, H, D, buckets};
    check_status(kernels::t5_attention_cuda(g, cuda::current_stream()), "t5_attention", "cuda");
    return compare(o, ref, 1e-5);
  })});
  return out;
}

#else
// Without CUDA there is nothing to smoke-test: doctor lists no GPU.
Results quant_family(int) { return {}; }
Results rope_family(int) { return {}; }
Results layout_family(int) { return {}; }
Results attention_family(int) { return {}; }
Results sage_family(int) { return {}; }
Results t5_attention_family(int) { return {}; }
Results sla_family(int) { return {}; }
Results sagesla_family(int) { return {}; }
#endif

}  // namespace td::ops::smoke
