// `turbodiff dit`: one Wan DiT forward, read from and written to safetensors
// files, so the engine can be checked against other implementations (ours on
// another device or dtype, diffusers, TurboDiffusion).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>

#include "apps/commands.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "ops/sla.h"
#include "io/safetensors.h"
#include "models/wan/wan_attention.h"
#include "models/wan/wan_dit.h"
#include "models/wan/wan_loader.h"

namespace td::app {
namespace {

struct DitOptions {
  std::vector<std::string> weights;
  std::string inputs, out, config;
  std::string device = "auto";  // auto: cuda when a GPU is usable, else cpu
  std::string dtype = "auto";   // auto: f32 on cpu, bf16 on cuda
  std::string attention = "original";
  double sla_topk = 0.1;  // TurboDiffusion's --sla_topk default
  bool quant_linear = false;
  bool default_norm = false;       // plain unfused norms instead of the FastNorm kernels
  bool allow_zero_proj_l = false;  // --attention auto may take sla/sagesla on a checkpoint without proj_l
  std::string int8_variant;  // "" = nn::kDefaultInt8LinearVariant
  int repeat = 1;  // forwards to time (the output is the last one's)
};

int run_dit(const DitOptions& o) {
  // Switches first: a request that cannot run fails before anything is loaded.
  if (!o.int8_variant.empty() && !o.quant_linear)
    fail(ErrorKind::Usage, "--int8-variant ", o.int8_variant,
         " only applies with --quant-linear (without it the linears run in the float run dtype)");
  const auto variant = o.int8_variant.empty() ? std::optional(nn::kDefaultInt8LinearVariant)
                                              : nn::parse_int8_linear_variant(o.int8_variant);
  if (!variant)
    fail(ErrorKind::Usage, "--int8-variant ", o.int8_variant, ": expected token128, block128 or post-scale");
  if (o.allow_zero_proj_l && o.attention != "auto")
    fail(ErrorKind::Usage, "--allow-zero-proj-l only applies with --attention auto (an explicit sla / sagesla "
                           "already runs a checkpoint without proj_l with proj_l = 0)");
  // auto is resolved once the checkpoint is loaded (whether it has proj_l decides); until then: original.
  std::string attention_name = o.attention == "auto" ? std::string("original") : o.attention;
  nn::AttentionKind attention = *nn::parse_attention_kind(attention_name);

  const bool gpu = cuda::device_count() > 0;
  const std::string device_name = o.device == "auto" ? (gpu ? "cuda" : "cpu") : o.device;
  if (device_name == "cuda" && !gpu)
    fail(ErrorKind::Unsupported, "--device cuda: no usable CUDA GPU (", cuda::unavailable_reason(), ")");
  const Device device = device_name == "cuda" ? Device::cuda(0) : Device::cpu();
  const std::string dtype_str = o.dtype == "auto" ? (device.is_cuda() ? "bf16" : "f32") : o.dtype;
  const DType dtype = dtype_str == "bf16" ? DType::BF16 : DType::F32;
  if (attention == nn::AttentionKind::SageSLA && device.is_cuda()) {
    ops::SlaOptions sage_blocks;  // sagesla's 64 x 128 blocks run on the SageAttention-style kernel
    sage_blocks.block_q = 64;
    sage_blocks.block_k = 128;
    if (!ops::sla_cuda_available(sage_blocks))
      fail(ErrorKind::Unsupported, "--attention sagesla on CUDA: this build has no SageAttention-style sparse "
           "kernel (kernels/sage_attention); use --attention sla (BF16 sparse branch on CUDA), --device cpu or "
           "--attention original");
  }
  if (device.is_cuda() && dtype == DType::F32)
    fail(ErrorKind::Unsupported,
         "--dtype f32 on CUDA: the GPU attention kernels (cuDNN, flash) take bf16; use --dtype bf16 on CUDA, or "
         "--device cpu for the f32 reference");

  // Inputs: exactly latent, timestep, context.
  const io::TensorFile in = io::read_safetensors(o.inputs);
  std::map<std::string, Tensor> inputs;
  for (const auto& [n, t] : in.tensors) inputs[n] = t;
  std::vector<std::string> problems;
  for (const char* need : {"latent", "timestep", "context"})
    if (!inputs.count(need)) problems.push_back(cat("missing tensor '", need, "'"));
  for (const auto& [n, t] : inputs)
    if (n != "latent" && n != "timestep" && n != "context") problems.push_back(cat("unexpected tensor '", n, "'"));
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems) msg += (msg.empty() ? "" : "; ") + p;
    fail(ErrorKind::Format, o.inputs, ": ", msg,
         " (expected latent [B, C, T, H, W], timestep [B] and context [B, Lc, text_dim], all f32)");
  }

  const auto t0 = std::chrono::steady_clock::now();
  models::wan::WanLoadOptions lo;
  lo.device = device;
  lo.dtype = dtype;
  lo.config_path = o.config;
  if (o.quant_linear) lo.int8_variant = *variant;
  models::wan::WanCheckpoint ck = models::wan::load_wan_checkpoint(o.weights, lo);
  const std::string description = ck.detection.description;
  const std::string int8_weights =
      o.quant_linear ? cat("W8A8 ", nn::int8_linear_variant_name(*variant), " (", ck.int8_from_checkpoint,
                           " INT8 from the checkpoint, ", ck.int8_quantized_at_load, " quantized at load)")
      : ck.int8_dequantized ? std::string("dequantized at load")
                            : std::string("none");
  if (o.attention == "auto") {
    const auto choice = models::wan::choose_attention("auto", device, ck.has_proj_l, o.allow_zero_proj_l);
    attention = choice.kind;
    attention_name = nn::attention_kind_name(choice.kind);
    std::fprintf(stderr, "%s\n", choice.reason.c_str());
  }
  if (attention != nn::AttentionKind::Original && !ck.has_proj_l)
    log_info("--attention ", attention_name, ": the checkpoint has no SLA proj_l; running with proj_l = 0 (the "
             "zero initialisation of an untrained TurboDiffusion SLA layer)");
  const models::wan::WanDiT model(std::move(ck), attention, o.sla_topk, o.default_norm);
  try {
    model.check_inputs(inputs["latent"], inputs["timestep"], inputs["context"]);
  } catch (const Error& e) {
    fail(e.kind(), o.inputs, ": ", e.what(), " (model ", model.config().describe(), ")");
  }
  const auto t1 = std::chrono::steady_clock::now();
  Tensor velocity;
  std::vector<double> times;
  for (int i = 0; i < o.repeat; ++i) {
    const auto s = std::chrono::steady_clock::now();
    velocity = model.forward(inputs["latent"], inputs["timestep"], inputs["context"]);
    if (device.is_cuda()) cuda::synchronize(device.index);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
  }
  if (!velocity.device().is_cpu()) velocity = velocity.to(Device::cpu());

  const std::map<std::string, std::string> meta = {
      {"model", model.config().describe()},
      {"checkpoint", description},
      {"device", device.str()},
      {"dtype", dtype_name(dtype)},
      {"attention", attention == nn::AttentionKind::Original ? attention_name
                                                             : cat(attention_name, " topk ", o.sla_topk)},
      {"int8_weights", int8_weights},
      {"norms", o.default_norm ? "default (unfused)" : "fused (FastNorm)"}};
  io::write_safetensors(o.out, {{"velocity", velocity}}, meta);
  const double load_s = std::chrono::duration<double>(t1 - t0).count();
  std::string timing = cat("forward ", times.front(), " s");
  if (times.size() > 1) {
    // The first forward builds plans (cuDNN graphs, cuBLASLt heuristics); the median of the rest is the steady state.
    std::vector<double> rest(times.begin() + 1, times.end());
    std::sort(rest.begin(), rest.end());
    timing += cat(" first, ", rest[rest.size() / 2], " s median of the next ", rest.size());
  }
  std::printf("velocity %s written to %s (%s; %s %s, attention %s, linears %s; load %.2f s, %s)\n",
              shape_str(velocity.shape()).c_str(), o.out.c_str(), model.config().variant.c_str(),
              device.str().c_str(), dtype_name(dtype), meta.at("attention").c_str(),
              o.quant_linear ? int8_weights.c_str() : "float", load_s, timing.c_str());
  return 0;
}

}  // namespace

void register_dit(CLI::App& app, Commands& cmds) {
  auto o = std::make_shared<DitOptions>();
  auto* sub = app.add_subcommand(
      "dit", "One Wan DiT forward from a safetensors file of inputs (latent, timestep, context) to one of outputs "
             "(velocity): for checking the engine against other implementations");
  sub->add_option("--weights", o->weights,
                  "DiT checkpoint files or folders: original Wan, diffusers (sharded), rCM/TurboDiffusion .pth")
      ->required()
      ->expected(1, -1);
  sub->add_option("--inputs", o->inputs,
                  "safetensors with latent [B, C, T, H, W], timestep [B], context [B, Lc, text_dim] (f32)")
      ->required();
  sub->add_option("--out", o->out, "safetensors to write: velocity [B, out_dim, T, H, W] (f32), written atomically")
      ->required();
  sub->add_option("--config", o->config,
                  "diffusers config.json of the model (default: config.json beside the weights, else detected)");
  sub->add_option("--device", o->device, "cpu or cuda (default: cuda when a GPU is usable, else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_option("--dtype", o->dtype, "run dtype of the matmuls: f32 (CPU reference) or bf16 (default: f32 on cpu, "
                                       "bf16 on cuda)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  sub->add_option("--attention", o->attention,
                  "original (exact), sla or sagesla (CPU: the fp32 SLA reference; CUDA: GPU kernels, blocks 128x64 for "
                  "sla and 64x128 for sagesla, no quantization), auto (the fastest path that runs here and keeps "
                  "the checkpoint's model: sagesla, then sla, when the checkpoint has SLA proj_l; else original; "
                  "it says which it took)")
      ->check(CLI::IsMember({"original", "sla", "sagesla", "auto"}));
  sub->add_option("--sla-topk", o->sla_topk, "sla / sagesla: fraction of key blocks kept per query block (default 0.1)")
      ->check(CLI::Range(1e-6, 1.0));
  sub->add_flag("--quant-linear", o->quant_linear,
                "W8A8 INT8 block linears (q, k, v, o, ffn): TurboDiffusion INT8 weights as they are, float weights "
                "quantized at load");
  sub->add_flag("--default-norm", o->default_norm,
                "plain unfused norms (LayerNorm, then a separate modulation and residual add; RMSNorm, then a "
                "separate RoPE) instead of the fused FastNorm kernels");
  sub->add_flag("--allow-zero-proj-l", o->allow_zero_proj_l,
                "with --attention auto: accept sla/sagesla on a checkpoint without SLA proj_l (runs proj_l = 0, a "
                "sparse approximation of the dense model)");
  sub->add_option("--int8-variant", o->int8_variant,
                  "with --quant-linear: token128 (default; 128x128 weight blocks, 1x128 activation groups), block128 "
                  "(TurboDiffusion parity) or post-scale (per-channel x per-token; fastest, less accurate)")
      ->check(CLI::IsMember({"token128", "block128", "post-scale"}));
  sub->add_option("--repeat", o->repeat, "Run the forward N times and report the timings (output: the last)")
      ->check(CLI::Range(1, 1000));
  cmds.emplace_back(sub, [o] { return run_dit(*o); });
}

}  // namespace td::app
