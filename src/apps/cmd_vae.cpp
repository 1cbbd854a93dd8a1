// `turbodiff vae decode|encode`: the Wan2.1 VAE as a stage tool, from one
// safetensors file to another, so it can be checked against diffusers and
// chained with `turbodiff dit`. decode: latent [B, 16, T, H, W] (normalised,
// as the DiT sees it) -> video [B, 3, 4(T-1)+1, 8H, 8W] in [-1, 1]; encode:
// video -> latent (normalised posterior mean).
#include <chrono>
#include <cstdio>

#include "apps/commands.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "models/wan_vae/wan_vae.h"

namespace td::app {
namespace {

struct VaeOptions {
  std::string vae, inputs, out, config;
  std::string device = "cpu";
};

int run_vae(const VaeOptions& o, bool decode) {
  if (o.device == "cuda")
    fail(ErrorKind::Unsupported, "--device cuda: VAE on CUDA not implemented yet; --device cpu runs the fp32 VAE");
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

  const auto t0 = std::chrono::steady_clock::now();
  models::wan_vae::WanVaeLoadOptions lo;
  lo.config_path = o.config;
  const models::wan_vae::WanVae vae(models::wan_vae::load_wan_vae(o.vae, lo));
  try {
    decode ? vae.check_latent(*x) : vae.check_video(*x);
  } catch (const Error& e) {
    fail(e.kind(), o.inputs, ": ", e.what(), " (", vae.config().describe(), ")");
  }
  const auto t1 = std::chrono::steady_clock::now();
  const Tensor y = decode ? vae.decode(*x) : vae.encode(*x);
  const auto t2 = std::chrono::steady_clock::now();
  io::write_safetensors(o.out, {{out_name, y}},
                        {{"model", vae.config().describe()}, {"vae_layout", vae.layout()}, {"device", "cpu"},
                         {"dtype", "f32"}});
  std::printf("%s %s written to %s (%s; cpu f32; load %.2f s, %s %.2f s)\n", out_name, shape_str(y.shape()).c_str(),
              o.out.c_str(), vae.layout().c_str(), std::chrono::duration<double>(t1 - t0).count(),
              decode ? "decode" : "encode", std::chrono::duration<double>(t2 - t1).count());
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
    sub->add_option("--vae", o->vae, "VAE checkpoint: Wan2.1_VAE.pth (original names) or diffusers AutoencoderKLWan")
        ->required();
    sub->add_option("--inputs", o->inputs,
                    decode ? "safetensors with tensor 'latent'" : "safetensors with tensor 'video'")
        ->required();
    sub->add_option("--out", o->out,
                    decode ? "safetensors to write: tensor 'video' (f32)" : "safetensors to write: tensor 'latent' (f32)")
        ->required();
    sub->add_option("--config", o->config, "diffusers config.json of the VAE (default: config.json beside it)");
    sub->add_option("--device", o->device, "cpu (cuda: not implemented yet)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmds.emplace_back(sub, [o, decode] { return run_vae(*o, decode); });
  }
}

}  // namespace td::app
