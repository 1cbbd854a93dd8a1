// Which self-attention path a Wan DiT runs: `--attention original|sla|sagesla|auto`.
//
// What a demanding user expects of `auto`: the fastest path that computes the
// model the checkpoint holds, never a silent change of the model. Sparse-linear
// attention (sla, sagesla) is only the same model when the checkpoint was
// trained for it, which its SLA proj_l tensors show (TurboDiffusion SLA
// checkpoints). So auto takes, in order:
//   sagesla  if its CUDA kernel runs here and the checkpoint has proj_l
//   sla      if its CUDA kernel runs here and the checkpoint has proj_l
//   original otherwise (exact attention: cuDNN or the portable flash kernel)
// A checkpoint without proj_l gets sla/sagesla from auto only with
// allow_zero_proj_l (`--allow-zero-proj-l`): the user accepts proj_l = 0, the
// zero initialisation of an untrained SLA layer, i.e. a sparse approximation of
// the dense model. On the CPU auto is always original: the host has only the
// fp32 SLA reference, which is there to check the kernels, not to be fast.
// Every choice comes with a sentence saying why, which the CLI logs.
#pragma once

#include <string>
#include <string_view>

#include "core/tensor.h"
#include "nn/attention.h"

namespace td::models::wan {

// Whether `kind` can run on `device` in this build (original: always; sla and
// sagesla: the fp32 reference on the CPU; on CUDA whether this build's ops::sla
// has a kernel for the kind's block sizes). *why gets the reason when it cannot.
bool attention_available(nn::AttentionKind kind, Device device, std::string* why = nullptr);

struct AttentionChoice {
  nn::AttentionKind kind = nn::AttentionKind::Original;
  std::string reason;  // one sentence for the log: what was taken and why
};

// Resolves a request ("original", "sla", "sagesla" or "auto"). An explicit
// request is returned as it is (WanDiT and ops::sla refuse what cannot run,
// naming why and what would run); auto probes. Usage error for an unknown name.
AttentionChoice choose_attention(std::string_view requested, Device device, bool has_proj_l, bool allow_zero_proj_l);

}  // namespace td::models::wan
