// What all attention backends share: the problem description, its argument
// check and the thread-local reason of the last failure.
#include <cmath>
#include <string>

#include "kernels/attention/attention.h"

namespace td::kernels {
namespace {

thread_local std::string t_last_error;

bool is_float_type(ElemType t) { return t == ElemType::F32 || t == ElemType::F16 || t == ElemType::BF16; }

const char* elem_name(ElemType t) {
  switch (t) {
    case ElemType::F32: return "f32";
    case ElemType::F16: return "f16";
    case ElemType::BF16: return "bf16";
    case ElemType::I8: return "i8";
    case ElemType::F8E4M3: return "f8e4m3";
  }
  return "?";
}

std::string strides_str(const AttnStrides& s) {
  return "(batch " + std::to_string(s.batch) + ", head " + std::to_string(s.head) + ", token " +
         std::to_string(s.token) + ")";
}

}  // namespace

namespace detail {
Status attn_fail(Status s, const std::string& message) {
  t_last_error = message;
  return s;
}
void attn_clear_error() { t_last_error.clear(); }
}  // namespace detail

const char* attention_last_error() { return t_last_error.c_str(); }

AttnStrides attn_contiguous_strides(AttnLayout layout, int64_t heads, int64_t len, int64_t head_dim) {
  if (layout == AttnLayout::BLHD) return {len * heads * head_dim, head_dim, heads * head_dim};
  return {heads * len * head_dim, len * head_dim, head_dim};
}

AttnProblem AttnProblem::make(AttnLayout layout, int64_t batch, int64_t heads, int64_t len_q, int64_t len_kv,
                              int64_t head_dim, ElemType io_type) {
  AttnProblem p;
  p.batch = batch;
  p.heads = heads;
  p.len_q = len_q;
  p.len_kv = len_kv;
  p.head_dim = head_dim;
  p.q = p.o = attn_contiguous_strides(layout, heads, len_q, head_dim);
  p.k = p.v = attn_contiguous_strides(layout, heads, len_kv, head_dim);
  p.scale = head_dim > 0 ? float(1.0 / std::sqrt(double(head_dim))) : 0.f;
  p.qkv_type = p.o_type = io_type;
  return p;
}

Status attention_check(const AttnProblem& p) {
  using detail::attn_fail;
  if (p.batch < 1 || p.heads < 1 || p.len_q < 1 || p.len_kv < 1 || p.head_dim < 1)
    return attn_fail(Status::InvalidArgument,
                     "attention: sizes must be >= 1, got batch " + std::to_string(p.batch) + ", heads " +
                         std::to_string(p.heads) + ", len_q " + std::to_string(p.len_q) + ", len_kv " +
                         std::to_string(p.len_kv) + ", head_dim " + std::to_string(p.head_dim));
  const std::pair<const char*, const AttnStrides*> all[] = {{"Q", &p.q}, {"K", &p.k}, {"V", &p.v}, {"O", &p.o}};
  for (const auto& [name, s] : all)
    if (s->batch < 0 || s->head < 0 || s->token < 0)
      return attn_fail(Status::InvalidArgument,
                       std::string("attention: ") + name + " strides must be non-negative, got " + strides_str(*s));
  if (!(p.scale > 0.f) || !std::isfinite(p.scale))
    return attn_fail(Status::InvalidArgument,
                     "attention: softmax scale must be finite and > 0, got " + std::to_string(p.scale));
  if (!is_float_type(p.qkv_type) || !is_float_type(p.o_type))
    return attn_fail(Status::InvalidArgument, std::string("attention: Q/K/V and O must be f32, f16 or bf16, got ") +
                                                  elem_name(p.qkv_type) + " in, " + elem_name(p.o_type) + " out");
  detail::attn_clear_error();
  return Status::Ok;
}

}  // namespace td::kernels
