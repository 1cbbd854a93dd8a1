// Benchmark of the CUDA Wan VAE (channels-last BF16, cuDNN convolutions) at
// Wan2.1-1.3B 480p: latent [1, 16, 21, 60, 104] -> video [1, 3, 81, 480, 832],
// with random weights in the real Wan2.1 VAE configuration (base_dim 96,
// z_dim 16; ~127M parameters), untiled and with diffusers' default tiling
// (256x256 pixels every 192). For each: the wall time of WanVae::decode (it
// returns host f32 frames, so the device-to-host copy of the frames is
// included; a CUDA-event time of the same call is reported beside it), and the
// peak of the memory pool during the call (weights included: they are
// converted to BF16 on the device once, before the timed calls). The encoder
// (81 frames 480x832 -> latent) is timed the same way. A warm-up call on 2
// latent frames (5 video frames) first builds every cuDNN plan and converts
// the weights. Prints one JSON object; bench/torch_vae.py measures diffusers'
// AutoencoderKLWan in BF16 on the same shapes.
//
// --unfused-bias runs every convolution as a plain cuDNN convolution plus a
// separate bias add (ops::set_conv_cl_fuse_bias(false)), to compare the plan
// build time (warmup_*_s, per phase, with the number of cuDNN plans built)
// and the run time of the two.
//
// TAEHV (taew2_1's tiny decoder, models/taehv, random weights in its real
// widths 256/128/64/64) decodes the same latent first, timed the same way
// (wall, events, peak; warm-up: one decode per chunking, which builds the
// cuDNN plans of every shape), once per chunking: 4 latent frames at a time (the
// default) and all 21 at once; "taehv" in the JSON, with the speed-up over
// the Wan VAE's untiled decode. --taehv-only skips the Wan VAE; --no-taehv skips TAEHV.
//
//   bench_vae [--frames 21] [--height 60] [--width 104] [--reps 2] [--no-encode] [--unfused-bias]
//             [--taehv-only] [--no-taehv]
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "bench_util.h"
#include "core/cuda_runtime.h"
#include "kernels/conv/conv.h"
#include "models/taehv/taehv.h"
#include "models/wan_vae/wan_vae.h"
#include "ops/conv.h"

namespace {

using namespace td;
using models::wan_vae::WanVae;
using models::wan_vae::WanVaeRunOptions;

// Random weights in the real layout: weights U(-a, a) with a = sqrt(3 / fan_in)
// (unit-variance outputs), biases U(-0.05, 0.05), gammas 1 +- 0.1.
models::wan_vae::WanVaeCheckpoint random_checkpoint() {
  models::wan_vae::WanVaeCheckpoint ck;
  ck.path = "random";
  ck.layout = "original";
  std::mt19937 rng(20261130u);
  for (const auto& spec : models::wan_vae::wan_vae_tensor_specs(ck.config)) {
    Tensor t = Tensor::empty(spec.shape, DType::F32);
    float* p = t.data<float>();
    const int64_t n = t.numel();
    const bool gamma = spec.original.find("gamma") != std::string::npos;
    const bool bias = spec.original.find(".bias") != std::string::npos;
    const double fan_in = spec.shape.size() > 1 ? double(n / spec.shape[0]) : 1.0;
    const float a = bias ? 0.05f : gamma ? 0.1f : float(std::sqrt(3.0 / fan_in));
    std::uniform_real_distribution<float> u(-a, a);
    for (int64_t i = 0; i < n; ++i) p[i] = (gamma ? 1.0f : 0.0f) + u(rng);
    ck.tensors[spec.original] = t;
  }
  return ck;
}

Tensor random_host(const Shape& shape, float lo, float hi, unsigned seed) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
  return t;
}

struct Measured {
  double wall_ms = 0, event_ms = 0, peak_mib = 0;
};

template <typename Fn>
Measured measure(Fn&& fn) {
  cuda::synchronize(0);
  cuda::reset_peak(0);
  cudaEvent_t a, b;
  TD_BENCH_CUDA(cudaEventCreate(&a));
  TD_BENCH_CUDA(cudaEventCreate(&b));
  const auto t0 = std::chrono::steady_clock::now();
  TD_BENCH_CUDA(cudaEventRecord(a, cudaStreamPerThread));
  fn();
  TD_BENCH_CUDA(cudaEventRecord(b, cudaStreamPerThread));
  TD_BENCH_CUDA(cudaEventSynchronize(b));
  const auto t1 = std::chrono::steady_clock::now();
  Measured m;
  float ms = 0;
  TD_BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
  m.event_ms = ms;
  m.wall_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  m.peak_mib = double(cuda::peak_allocated_bytes(0)) / double(1 << 20);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return m;
}

nlohmann::json run_reps(int reps, const std::function<void()>& fn) {
  nlohmann::json j = nlohmann::json::array();
  for (int r = 0; r < reps; ++r) {
    const Measured m = measure(fn);
    j.push_back({{"wall_ms", m.wall_ms}, {"event_ms", m.event_ms}, {"peak_mib", m.peak_mib}});
    std::fprintf(stderr, "  wall %.1f ms, events %.1f ms, peak %.1f MiB\n", m.wall_ms, m.event_ms, m.peak_mib);
  }
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t frames = 21, height = 60, width = 104;
  int reps = 2;
  bool encode = true, taehv = true, wan = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoll(argv[++i]) : 0; };
    if (a == "--frames") frames = next();
    else if (a == "--height") height = next();
    else if (a == "--width") width = next();
    else if (a == "--reps") reps = int(next());
    else if (a == "--no-encode") encode = false;
    else if (a == "--unfused-bias") td::ops::set_conv_cl_fuse_bias(false);
    else if (a == "--taehv-only") wan = false;
    else if (a == "--no-taehv") taehv = false;
    else {
      std::fprintf(stderr, "bench_vae: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    cuda::set_device(0);
    const Tensor latent = random_host({1, 16, frames, height, width}, -2.0f, 2.0f, 7u);
    nlohmann::json tj;
    if (taehv) {
      const models::taehv::TaehvDecoder tae(models::taehv::random_taehv_checkpoint());
      tj["config"] = tae.config().describe();
      tj["video"] = {1, 3, tae.config().frames_out(frames), height * 8, width * 8};
      tj["dtype"] = "bf16";
      models::taehv::TaehvRunOptions o;
      o.device = Device::cuda(0);
      o.dtype = DType::BF16;
      for (const int64_t chunk : {int64_t(4), int64_t(0)}) {
        const std::string k = chunk ? "decode_chunk4" : "decode_all";
        o.latent_frames_per_chunk = chunk;
        try {  // a failure is recorded; the rest is still measured
          const auto w0 = std::chrono::steady_clock::now();
          tae.decode(latent, o);  // warm-up: weights, and the cuDNN plans of every shape
          cuda::synchronize(0);
          tj["warmup_" + k + "_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
          tj["weights_mib"] = double(cuda::allocated_bytes(0)) / double(1 << 20);
          std::fprintf(stderr, "taehv decode, %s latent frames per chunk:\n", chunk ? "4" : "all");
          tj[k] = run_reps(reps, [&] { tae.decode(latent, o); });
        } catch (const std::exception& e) {
          std::fprintf(stderr, "bench_vae: taehv %s: %s\n", k.c_str(), e.what());
          tj[k + "_error"] = e.what();
          cuda::synchronize(0);
        }
      }
      tae.release_device_weights();
    }
    if (!wan) {
      nlohmann::json out;
      out["device"] = cuda::device_info(0).name;
      out["latent"] = {1, 16, frames, height, width};
      out["taehv"] = tj;
      std::printf("%s\n", out.dump(2).c_str());
      return 0;
    }
    const WanVae vae(random_checkpoint());
    WanVaeRunOptions untiled;
    untiled.device = Device::cuda(0);
    untiled.dtype = DType::BF16;
    WanVaeRunOptions tiled = untiled;
    tiled.tiling.enabled = true;

    nlohmann::json out;
    out["device"] = cuda::device_info(0).name;
    out["latent"] = {1, 16, frames, height, width};
    out["video"] = {1, 3, 4 * (frames - 1) + 1, height * 8, width * 8};
    out["dtype"] = "bf16";
    out["tiling"] = tiled.tiling.describe();

    out["bias_fused"] = ops::conv_cl_fuse_bias();
    const Tensor warm = latent.slice(2, 0, std::min<int64_t>(2, frames)).contiguous();
    const auto warmup = [&](const char* key, const std::function<void()>& fn) {
      const auto w0 = std::chrono::steady_clock::now();
      const size_t plans0 = kernels::conv_cudnn_cached_plans();
      fn();
      cuda::synchronize(0);
      out[std::string("warmup_") + key + "_s"] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      out[std::string("plans_") + key] = kernels::conv_cudnn_cached_plans() - plans0;
    };
    warmup("decode_untiled", [&] { vae.decode(warm, untiled); });
    warmup("decode_tiled", [&] { vae.decode(warm, tiled); });
    out["weights_mib"] = double(cuda::allocated_bytes(0)) / double(1 << 20);

    std::fprintf(stderr, "decode untiled:\n");
    out["decode_untiled"] = run_reps(reps, [&] { vae.decode(latent, untiled); });
    std::fprintf(stderr, "decode tiled (%s):\n", tiled.tiling.describe().c_str());
    out["decode_tiled"] = run_reps(reps, [&] { vae.decode(latent, tiled); });
    if (encode) {
      const int64_t f = 4 * (frames - 1) + 1;
      const Tensor video = random_host({1, 3, f, height * 8, width * 8}, -1.0f, 1.0f, 11u);
      warmup("encode", [&] { vae.encode(video.slice(2, 0, 5).contiguous(), untiled); });  // plans of the encoder
      std::fprintf(stderr, "encode untiled:\n");
      out["encode_untiled"] = run_reps(1, [&] { vae.encode(video, untiled); });
    }
    if (taehv) {
      const auto best = [](const nlohmann::json& runs) {
        double m = 1e30;
        for (const auto& r : runs) m = std::min(m, r["wall_ms"].get<double>());
        return m;
      };
      for (const char* k : {"decode_chunk4", "decode_all"})
        if (tj.contains(k)) tj[std::string("speedup_vs_wan_vae_untiled_") + k] = best(out["decode_untiled"]) / best(tj[k]);
      out["taehv"] = tj;
    }
    std::printf("%s\n", out.dump(2).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vae: %s\n", e.what());
    return 1;
  }
  return 0;
}
