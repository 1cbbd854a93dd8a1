// `turbodiff vae decode|encode`: the Wan2.1 VAE as a stage tool, from one
// safetensors file to another, so it can be checked against diffusers and
// chained with `turbodiff dit`. decode: latent [B, 16, T, H, W] (normalised,
// as the DiT sees it) -> video [B, 3, 4(T-1)+1, 8H, 8W] in [-1, 1]; encode:
// video -> latent (normalised posterior mean). --device cuda runs the
// channels-last BF16 path (cuDNN convolutions); --vae-tiling / --vae-tile /
// --vae-tile-stride split frames into overlapping blended tiles (diffusers'
// tiled_decode / tiled_encode) to bound memory. decode --decoder taehv runs
// the TAEHV tiny decoder (taew2_1.pth, models/taehv) on the same latent: a
// fast approximate preview, same output shape and range.
#include <chrono>
#include <cstdio>

#include "core/cuda_runtime.h"

#include "apps/commands.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "models/taehv/taehv.h"
#include "models/wan_vae/wan_vae.h"

namespace td::app {
namespace {

struct VaeOptions {
  std::string vae, inputs, out, config;
  std::string device = "cpu";
  std::string dtype;  // "" = bf16 on CUDA, f32 on the CPU
  bool tiling = false;
  int64_t tile = 0, tile_stride = 0;  // pixels; 0 = default (256, 3/4 of the tile)
  std::string decoder = "wan";        // wan | taehv
  int64_t taehv_chunk = 4;            // TAEHV latent frames per chunk (0 = all)
};

models::wan_vae::WanVaeRunOptions run_options(const VaeOptions& o) {
  models::wan_vae::WanVaeRunOptions r;
  if (o.device == "cuda") {
    TD_CHECK(cuda::device_count() > 0, Unsupported, "--device cuda: no usable CUDA GPU (",
             cuda::unavailable_reason(), "); --device cpu runs the fp32 VAE");
    r.device = Device::cuda(0);
  } else {
    r.device = Device::cpu();
  }
  if (!o.dtype.empty()) {
    TD_CHECK(o.device == "cuda" || o.dtype == "f32", Usage, "--dtype ", o.dtype,
             ": the CPU VAE runs in f32 (bf16 is for --device cuda)");
    r.dtype = o.dtype == "bf16" ? DType::BF16 : DType::F32;
  }
  r.tiling.enabled = o.tiling || o.tile > 0 || o.tile_stride > 0;
  if (o.tile > 0) r.tiling.tile_height = r.tiling.tile_width = o.tile;
  const int64_t stride = o.tile_stride > 0 ? o.tile_stride : o.tile > 0 ? o.tile * 3 / 4 / 8 * 8 : 0;
  if (stride > 0) r.tiling.stride_height = r.tiling.stride_width = stride;
  return r;
}

int run_taehv_decode(const VaeOptions& o, const models::wan_vae::WanVaeRunOptions& ro, const Tensor& latent) {
  const auto t0 = std::chrono::steady_clock::now();
  const models::taehv::TaehvDecoder dec(models::taehv::load_taehv(o.vae));
  try {
    dec.check_latent(latent);
  } catch (const Error& e) {
    fail(e.kind(), o.inputs, ": ", e.what(), " (", dec.config().describe(), ")");
  }
  models::taehv::TaehvRunOptions to;
  to.device = ro.device;
  to.dtype = ro.dtype;
  to.latent_frames_per_chunk = o.taehv_chunk;
  const bool cuda_run = to.device->is_cuda();
  const std::string dtype = cuda_run ? (to.dtype == DType::F32 ? "f32" : "bf16") : "f32";
  if (cuda_run) cuda::reset_peak(0);
  const auto t1 = std::chrono::steady_clock::now();
  const Tensor y = dec.decode(latent, to);
  const auto t2 = std::chrono::steady_clock::now();
  io::write_safetensors(o.out, {{"video", y}},
                        {{"model", dec.config().describe()}, {"decoder", "taehv"},
                         {"device", cuda_run ? "cuda" : "cpu"}, {"dtype", dtype}});
  const std::string peak =
      cuda_run ? cat(", peak GPU memory ", cuda::peak_allocated_bytes(0) / double(1 << 20), " MiB") : std::string();
  std::printf("video %s written to %s (%s; %s %s; load %.2f s, decode %.2f s%s)\n", shape_str(y.shape()).c_str(),
              o.out.c_str(), dec.config().describe().c_str(), cuda_run ? "cuda" : "cpu", dtype.c_str(),
              std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count(),
              peak.c_str());
  return 0;
}

int run_vae(const VaeOptions& o, bool decode) {
  const bool taehv = o.decoder == "taehv";
  TD_CHECK(!taehv || decode, Usage, "--decoder taehv: TAEHV is a decoder here; `vae encode` uses the Wan VAE");
  TD_CHECK(!taehv || !(o.tiling || o.tile > 0 || o.tile_stride > 0), Usage,
           "--decoder taehv: --vae-tiling / --vae-tile / --vae-tile-stride apply to the Wan VAE only (TAEHV bounds "
           "memory by decoding --taehv-chunk latent frames at a time)");
  TD_CHECK(o.taehv_chunk >= 0, Usage, "--taehv-chunk ", o.taehv_chunk, ": must be >= 0 (0 = all frames at once)");
  const models::wan_vae::WanVaeRunOptions ro = run_options(o);
  const char* in_name = decode ? "latent" : "video";
  const char* out_name = decode ? "video" : "latent";
  const io::TensorFile in = io::read_safetensors(o.inputs);
  const Tensor* x = in.find(in_name);
  std::string others;
  for (const auto& [n, t] : in.tensors)
    if (n != in_name) others += (others.empty() ? "" : ", ") + n;
  if (!x || !others.empty())
    fail(ErrorKind::Format, o.inputs, ": expected exactly one tensor '", in_name, "' (",
         decode ? "[B, 16, T, H, W]" : "[B, 3, F, H, W] in [-1, 1]", ")",
         x ? "" : cat("; it is missing"), others.empty() ? "" : cat("; unexpected tensor(s): ", others));

  if (taehv) return run_taehv_decode(o, ro, *x);
  const auto t0 = std::chrono::steady_clock::now();
  models::wan_vae::WanVaeLoadOptions lo;
  lo.config_path = o.config;
  const models::wan_vae::WanVae vae(models::wan_vae::load_wan_vae(o.vae, lo));
  try {
    decode ? vae.check_latent(*x) : vae.check_video(*x);
  } catch (const Error& e) {
    fail(e.kind(), o.inputs, ": ", e.what(), " (", vae.config().describe(), ")");
  }
  ro.tiling.validate(vae.config().spatial_factor());
  const bool cuda_run = ro.device->is_cuda();
  const std::string dtype = cuda_run ? (ro.dtype == DType::F32 ? "f32" : "bf16") : "f32";
  if (cuda_run) cuda::reset_peak(0);
  const auto t1 = std::chrono::steady_clock::now();
  const Tensor y = decode ? vae.decode(*x, ro) : vae.encode(*x, ro);
  const auto t2 = std::chrono::steady_clock::now();
  io::write_safetensors(o.out, {{out_name, y}},
                        {{"model", vae.config().describe()}, {"vae_layout", vae.layout()},
                         {"device", cuda_run ? "cuda" : "cpu"}, {"dtype", dtype},
                         {"vae_tiling", ro.tiling.describe()}});
  const std::string peak =
      cuda_run ? cat(", peak GPU memory ", cuda::peak_allocated_bytes(0) / double(1 << 20), " MiB") : std::string();
  std::printf("%s %s written to %s (%s; %s %s, tiling %s; load %.2f s, %s %.2f s%s)\n", out_name,
              shape_str(y.shape()).c_str(), o.out.c_str(), vae.layout().c_str(), cuda_run ? "cuda" : "cpu",
              dtype.c_str(), ro.tiling.describe().c_str(), std::chrono::duration<double>(t1 - t0).count(),
              decode ? "decode" : "encode", std::chrono::duration<double>(t2 - t1).count(), peak.c_str());
  return 0;
}

}  // namespace

void register_vae(CLI::App& app, Commands& cmds) {
  auto* vae = app.add_subcommand("vae", "The Wan2.1 VAE as a stage tool: decode latents to video, encode video");
  vae->require_subcommand(1);
  for (const bool decode : {true, false}) {
    auto o = std::make_shared<VaeOptions>();
    auto* sub = vae->add_subcommand(
        decode ? "decode" : "encode",
        decode ? "latent [B, 16, T, H, W] (normalised) -> video [B, 3, 4(T-1)+1, 8H, 8W] in [-1, 1]"
               : "video [B, 3, 4k+1, H, W] in [-1, 1] -> latent [B, 16, k+1, H/8, W/8] ((mu - mean) / std)");
    sub->add_option("--vae", o->vae,
                    "VAE checkpoint: Wan2.1_VAE.pth (original names) or diffusers AutoencoderKLWan; with --decoder "
                    "taehv the TAEHV checkpoint (taew2_1.pth or .safetensors)")
        ->required();
    sub->add_option("--inputs", o->inputs,
                    decode ? "safetensors with tensor 'latent'" : "safetensors with tensor 'video'")
        ->required();
    sub->add_option("--out", o->out,
                    decode ? "safetensors to write: tensor 'video' (f32)" : "safetensors to write: tensor 'latent' (f32)")
        ->required();
    sub->add_option("--decoder", o->decoder,
                    "wan (the Wan2.1 VAE, default) or taehv (decode only: the TAEHV tiny decoder, --vae taew2_1.pth "
                    "or .safetensors; fast approximate previews)")
        ->check(CLI::IsMember({"wan", "taehv"}));
    sub->add_option("--taehv-chunk", o->taehv_chunk,
                    "--decoder taehv: latent frames decoded at a time (0 = all; the result does not depend on it, "
                    "memory does; default 4)");
    sub->add_option("--config", o->config, "diffusers config.json of the VAE (default: config.json beside it)");
    sub->add_option("--device", o->device, "cpu (fp32 reference) or cuda (channels-last bf16, cuDNN convolutions)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    sub->add_option("--dtype", o->dtype, "bf16 (default on cuda) or f32")->check(CLI::IsMember({"bf16", "f32"}));
    sub->add_flag("--vae-tiling", o->tiling,
                  "split frames into overlapping tiles blended over the overlap (diffusers' tiling: 256x256 pixels "
                  "every 192) to bound memory; the result differs slightly near the seams");
    sub->add_option("--vae-tile", o->tile, "tile size in pixels (a multiple of 8; implies --vae-tiling)");
    sub->add_option("--vae-tile-stride", o->tile_stride,
                    "distance between tiles in pixels (a multiple of 8, at most the tile; default 3/4 of the tile)");
    cmds.emplace_back(sub, [o, decode] { return run_vae(*o, decode); });
  }
}

}  // namespace td::app
