#include "models/wan/wan_attention.h"

#include "ops/sla.h"

namespace td::models::wan {
namespace {

// Whether ops::sla runs CUDA tensors with the kind's block sizes (sla 128x64,
// sagesla 64x128, as nn::SelfAttention runs them) in this build.
bool probe_cuda(nn::AttentionKind kind, Device device, std::string* why) {
  ops::SlaOptions so;
  so.block_q = kind == nn::AttentionKind::SageSLA ? 64 : 128;
  so.block_k = kind == nn::AttentionKind::SageSLA ? 128 : 64;
  if (ops::sla_cuda_available(so)) return true;
  if (why)
    *why = cat("this build has no ", nn::attention_kind_name(kind), " kernel for CUDA (", so.block_q, "x", so.block_k,
               " blocks) on ", device.str());
  return false;
}

}  // namespace

bool attention_available(nn::AttentionKind kind, Device device, std::string* why) {
  if (kind == nn::AttentionKind::Original || device.is_cpu()) return true;
  return probe_cuda(kind, device, why);
}

AttentionChoice choose_attention(std::string_view requested, Device device, bool has_proj_l, bool allow_zero_proj_l) {
  using K = nn::AttentionKind;
  if (requested != "auto") {
    const auto kind = nn::parse_attention_kind(requested);
    TD_CHECK(kind.has_value(), Usage, "--attention ", requested, ": expected original, sla, sagesla or auto");
    // An explicit request is not probed here: the model's constructor and the
    // attention op refuse what cannot run, naming why and what would.
    AttentionChoice c{*kind, cat("--attention ", requested)};
    if (*kind != K::Original && !has_proj_l)
      c.reason += ": the checkpoint has no SLA proj_l; running with proj_l = 0 (the zero initialisation of an "
                  "untrained TurboDiffusion SLA layer)";
    return c;
  }
  if (device.is_cpu())
    return {K::Original, "--attention auto: original (on the CPU only the fp32 SLA reference exists, which checks the "
                         "kernels and is not a fast path)"};
  if (!has_proj_l && !allow_zero_proj_l)
    return {K::Original, "--attention auto: original (the checkpoint has no SLA proj_l, so it was not trained for "
                         "sparse attention; pass --allow-zero-proj-l to let auto take sagesla/sla with proj_l = 0, or "
                         "ask for --attention sagesla explicitly)"};
  const std::string proj = has_proj_l ? "the checkpoint's proj_l" : "proj_l = 0 (--allow-zero-proj-l)";
  std::string why_sage, why_sla;
  if (attention_available(K::SageSLA, device, &why_sage))
    return {K::SageSLA, cat("--attention auto: sagesla (its CUDA kernel runs here; ", proj, ")")};
  if (attention_available(K::SLA, device, &why_sla))
    return {K::SLA, cat("--attention auto: sla (sagesla cannot run here: ", why_sage, "; ", proj, ")")};
  return {K::Original,
          cat("--attention auto: original (sagesla cannot run here: ", why_sage, "; sla cannot either: ", why_sla, ")")};
}

}  // namespace td::models::wan
