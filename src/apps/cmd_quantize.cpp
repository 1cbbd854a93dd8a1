// `turbodiff quantize IN OUT`: converts a floating-point Wan / TurboDiffusion
// DiT checkpoint (any layout the Wan loader reads) to TurboDiffusion's "-quant"
// INT8 format, the state dict its modify_model.py export writes with
// --quant_linear: every Linear inside `blocks.*` that TurboDiffusion's
// Int8Linear replacement covers (self_attn/cross_attn q, k, v, o and ffn.0,
// ffn.2; not the SLA proj_l) becomes `<name>.int8_weight` (i8 [N, K]) and
// `<name>.scale` (f32 [ceil(N/128), ceil(K/128)], TurboDiffusion's 128x128
// block quantizer, quant_block128.h) with its `<name>.bias` kept; every other
// tensor is copied unchanged (dtype and shape), all under the original Wan
// names TurboDiffusion uses (wrapper prefixes such as "net." stripped,
// diffusers names mapped back). Written atomically as safetensors or as a
// torch.save-compatible .pth state dict (io/pth_writer.h).
#include <cstdio>
#include <cstring>

#include "apps/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "io/pth_writer.h"
#include "io/safetensors.h"
#include "io/checkpoint.h"
#include "models/detect.h"
#include "models/wan/wan_config.h"
#include "models/wan/wan_keys.h"
#include "models/wan/wan_loader.h"
#include "nn/int8_linear.h"

namespace td::app {
namespace {

struct QuantizeOptions {
  std::string in, out, config;
  std::string format = "auto";  // auto: pth for *.pth / *.pt, else safetensors
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int run_quantize(const QuantizeOptions& o) {
  const bool torch_name = ends_with(o.out, ".pth") || ends_with(o.out, ".pt");
  const std::string format = o.format == "auto" ? (torch_name ? "pth" : "safetensors") : o.format;
  if (format == "safetensors" && torch_name)
    fail(ErrorKind::Usage, "output ", o.out, " has a torch extension but --format is safetensors; name it *.safetensors");

  const io::TensorFile f = io::read_tensor_file(o.in);
  std::vector<std::pair<std::string, Tensor>> tensors(f.tensors.begin(), f.tensors.end());
  std::vector<models::TensorMeta> metas;
  for (const auto& [n, t] : tensors) {
    metas.push_back({n, t.dtype(), t.shape()});
    if (ends_with(n, ".int8_weight"))
      fail(ErrorKind::Usage, o.in, " is already INT8 quantized (it holds ", n,
           "); re-quantizing would round its weights twice. Quantize the floating-point checkpoint instead");
  }
  const models::ModelDetection d = models::detect_model(metas);
  TD_CHECK(d.kind == models::ModelKind::WanDiT, Format, o.in, " is not a Wan DiT checkpoint (", d.description, ")");
  const std::string cfg = o.config.empty() ? models::wan::find_wan_config_json(o.in) : o.config;
  const models::wan::WanConfig config =
      cfg.empty() ? models::wan::wan_config_from_detection(d, o.in) : models::wan::wan_config_from_json(cfg);
  const auto matched = models::wan::match_wan_tensors(tensors, d, config, o.in);

  bool with_proj_l = false;
  for (const auto& [name, src] : matched) with_proj_l |= name.find("local_attn.proj_l.") != std::string::npos;
  std::vector<std::pair<std::string, Tensor>> out;
  size_t quantized = 0, copied = 0;
  int64_t float_bytes = 0, int8_bytes = 0;
  for (const auto& spec : models::wan::wan_tensor_specs(config, with_proj_l)) {
    const auto it = matched.find(spec.name);
    if (it == matched.end()) continue;  // optional tensors absent from this checkpoint
    const Tensor& t = it->second.tensor;
    if (!spec.block_linear_weight) {
      out.emplace_back(spec.name, t.contiguous());
      ++copied;
      continue;
    }
    const std::string base = spec.name.substr(0, spec.name.size() - std::strlen(".weight"));
    const Tensor w = t.dtype() == DType::F64 ? t.contiguous().to(DType::F32) : t;
    ops::Int8LinearWeight q = nn::quantize_linear_weight(w, nn::Int8LinearVariant::Block128);
    float_bytes += int64_t(t.nbytes());
    int8_bytes += int64_t(q.q.nbytes() + q.scale.nbytes());
    out.emplace_back(base + ".int8_weight", std::move(q.q));
    out.emplace_back(base + ".scale", std::move(q.scale));
    ++quantized;
  }
  if (format == "pth")
    io::write_pth(o.out, out);  // a plain state dict, as TurboDiffusion's export torch.saves it
  else
    io::write_safetensors(o.out, out,
                          {{"format", "pt"},
                           {"turbodiff", "quantize: TurboDiffusion INT8 (128x128 block scales)"},
                           {"source", o.in}});
  std::printf("%s: %zu block linears quantized to INT8 (%.1f MB -> %.1f MB), %zu tensors copied unchanged -> %s\n",
              o.in.c_str(), quantized, double(float_bytes) / 1e6, double(int8_bytes) / 1e6, copied, o.out.c_str());
  return 0;
}

}  // namespace

void register_quantize(CLI::App& app, Commands& cmds) {
  auto o = std::make_shared<QuantizeOptions>();
  auto* sub = app.add_subcommand(
      "quantize", "Convert a floating-point Wan/TurboDiffusion DiT checkpoint to TurboDiffusion's INT8 format "
                  "(block linears as *.int8_weight + 128x128-block *.scale; everything else unchanged)");
  sub->add_option("IN", o->in, "DiT checkpoint file or folder (original Wan, diffusers, rCM/TurboDiffusion .pth)")
      ->required();
  sub->add_option("OUT", o->out, "file to write (atomically)")->required();
  sub->add_option("--format", o->format,
                  "output format: safetensors, pth (a torch.save-compatible state dict) or auto (default: pth for "
                  "*.pth / *.pt, else safetensors)")
      ->check(CLI::IsMember({"auto", "safetensors", "pth"}));
  sub->add_option("--config", o->config,
                  "diffusers config.json of the model (default: config.json beside IN, else detected)");
  cmds.emplace_back(sub, [o] { return run_quantize(*o); });
}

}  // namespace td::app
