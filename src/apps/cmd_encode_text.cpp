// `turbodiff encode-text`: prompt -> umT5 context, written to safetensors, so
// the text stage can be checked and cached on its own (the DiT's context input).
#include <chrono>
#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "models/umt5/umt5_encoder.h"
#include "models/umt5/umt5_loader.h"
#include "models/umt5/umt5_tokenizer.h"

namespace td::app {
namespace {

struct EncodeTextOptions {
  std::string text_encoder, tokenizer, prompt, out, config;
  std::string device = "auto";
  std::string dtype = "auto";  // auto: f32 on cpu, bf16 on cuda
  int64_t max_length = 512;
};

int run_encode_text(const EncodeTextOptions& o) {
  const bool gpu = cuda::device_count() > 0;
  const std::string device_name = o.device == "auto" ? (gpu ? "cuda" : "cpu") : o.device;
  if (device_name == "cuda" && !gpu)
    fail(ErrorKind::Unsupported, "--device cuda: no usable CUDA GPU (", cuda::unavailable_reason(), ")");
  const Device device = device_name == "cuda" ? Device::cuda(0) : Device::cpu();

  // The tokenizer first: it is small, and a wrong path fails before the 11 GB encoder loads.
  const models::umt5::UMT5Tokenizer tokenizer = models::umt5::UMT5Tokenizer::load(o.tokenizer);
  const auto t0 = std::chrono::steady_clock::now();
  models::umt5::UMT5LoadOptions lo;
  lo.device = device;
  const std::string dtype_str = o.dtype == "auto" ? (device.is_cuda() ? "bf16" : "f32") : o.dtype;
  lo.dtype = dtype_str == "bf16" ? DType::BF16 : DType::F32;
  if (device.is_cuda() && lo.dtype == DType::F32)
    fail(ErrorKind::Unsupported, "--dtype f32 on CUDA: the umT5 CUDA path runs bf16 linears; use --dtype bf16 on "
         "CUDA, or --device cpu for the f32 reference");
  lo.config_path = o.config;
  models::umt5::UMT5Encoder encoder(models::umt5::load_umt5(o.text_encoder, lo));
  TD_CHECK(tokenizer.vocab_size() <= encoder.config().vocab, Format, "tokenizer ", tokenizer.path(), " has ",
           tokenizer.vocab_size(), " pieces but the text encoder ", o.text_encoder, " has a vocabulary of ",
           encoder.config().vocab, ": they do not belong together");
  const auto t1 = std::chrono::steady_clock::now();

  const models::umt5::TokenizedBatch batch = tokenizer.tokenize({o.prompt}, o.max_length);
  Tensor hidden = encoder.forward(batch.ids, batch.mask);
  if (!hidden.device().is_cpu()) hidden = hidden.to(Device::cpu());
  const Tensor context = models::umt5::zero_pad_context(hidden, batch.lengths);
  const auto t2 = std::chrono::steady_clock::now();

  Tensor lens = Tensor::empty({1}, DType::I64);
  lens.data<int64_t>()[0] = batch.lengths[0];
  io::write_safetensors(o.out, {{"context", context}, {"context_lens", lens}},
                        {{"model", encoder.config().describe()},
                         {"text_encoder", o.text_encoder},
                         {"tokenizer", tokenizer.path()},
                         {"device", device.str()},
                         {"dtype", dtype_name(lo.dtype)},
                         {"zero_pad", "rows at and past context_lens are zero"}});
  std::printf("context %s (%lld tokens) written to %s (%s; load %.2f s, encode %.2f s)\n",
              shape_str(context.shape()).c_str(), static_cast<long long>(batch.lengths[0]), o.out.c_str(),
              device.str().c_str(), std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count());
  return 0;
}

}  // namespace

void register_encode_text(CLI::App& app, Commands& cmds) {
  auto o = std::make_shared<EncodeTextOptions>();
  auto* sub = app.add_subcommand("encode-text",
                                 "Encode a prompt with the umT5 text encoder into the DiT's context "
                                 "(safetensors: context [1, max_length, d_model] f32, context_lens [1] i64)");
  sub->add_option("--text-encoder", o->text_encoder,
                  "umT5 weights: Wan's models_t5_umt5-xxl-enc-bf16.pth or an HF UMT5EncoderModel (file or folder)")
      ->required();
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer folder with spiece.model (google/umt5-xxl), or the file")
      ->required();
  sub->add_option("--prompt", o->prompt, "the prompt text")->required();
  sub->add_option("--out", o->out, "safetensors to write (atomically)")->required();
  sub->add_option("--config", o->config,
                  "HF UMT5 config.json (default: a T5/UMT5 config.json beside the weights, else read from shapes)");
  sub->add_option("--device", o->device, "cpu or cuda (default: cuda when a GPU is usable, else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_option("--dtype", o->dtype,
                  "run dtype of the linears: f32 (CPU reference) or bf16 (half the memory of umT5-XXL's 23 GB in "
                  "f32; default: f32 on cpu, bf16 on cuda)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  sub->add_option("--max-length", o->max_length, "tokens per prompt after padding/truncation (Wan: 512)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmds.emplace_back(sub, [o] { return run_encode_text(*o); });
}

}  // namespace td::app
