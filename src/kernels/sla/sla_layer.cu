// The `sla` layer on the GPU (kernels/sla/sla.h): block selection
// (sla_block_select.cu) -> BF16 block-sparse flash attention
// (attention_flash_block_sparse_cuda, 128 x 64 blocks) writing o_s -> the
// linear branch with proj_l added onto o (sla_linear.cu). Host code only.
#include <cuda_runtime.h>

#include <string>

#include "kernels/sla/sla.h"

namespace td::kernels {
namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

size_t lut_bytes(const SlaProblem& p) {
  return size_t(p.batch * p.heads * p.query_blocks() * sla_selected_blocks(p.topk, p.key_blocks())) * 4;
}

AttnProblem attn_problem(const SlaProblem& p) {
  AttnProblem a;
  a.batch = p.batch;
  a.heads = p.heads;
  a.len_q = a.len_kv = p.len;
  a.head_dim = p.head_dim;
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.o = p.o;
  a.scale = p.scale;
  a.qkv_type = a.o_type = ElemType::BF16;
  return a;
}

}  // namespace

Status sla_sparse_cuda(const SlaProblem& p, const void* q, const void* k, const void* v, const int32_t* lut,
                       int64_t n_sel, void* o, float* lse, void* stream) {
  using detail::sla_fail;
  if (Status s = sla_check(p); s != Status::Ok) return s;
  if (p.block_q != 128 || p.block_k != 64)
    return sla_fail(Status::Unsupported, "sla_sparse_cuda: the BF16 sparse kernel takes 128 x 64 blocks, got " +
                                             std::to_string(p.block_q) + " x " + std::to_string(p.block_k));
  const Status s = attention_flash_block_sparse_cuda(attn_problem(p), q, k, v, o, lse, lut, n_sel, stream);
  if (s != Status::Ok) return sla_fail(s, std::string("sla_sparse_cuda: ") + attention_last_error());
  return Status::Ok;
}

size_t sla_workspace_size(const SlaProblem& p) {
  return align256(sla_block_select_workspace_size(p)) + align256(lut_bytes(p)) +
         align256(sla_linear_workspace_size(p));
}

Status sla_cuda(const SlaProblem& p, const void* q, const void* k, const void* v, const void* proj_weight,
                const void* proj_bias, ElemType proj_type, void* o, uint8_t* block_map, int32_t* lut, float* lse,
                void* workspace, size_t workspace_bytes, void* stream) {
  using detail::sla_fail;
  if (Status s = sla_check(p); s != Status::Ok) return s;
  if ((proj_weight == nullptr) != (proj_bias == nullptr))
    return sla_fail(Status::InvalidArgument, "sla_cuda: proj_l weight and bias must both be given or both be null");
  if (p.block_q != 128 || p.block_k != 64)
    return sla_fail(Status::Unsupported, "sla_cuda: the BF16 sparse kernel takes 128 x 64 blocks, got " +
                                             std::to_string(p.block_q) + " x " + std::to_string(p.block_k));
  const size_t need = sla_workspace_size(p);
  if (!workspace || workspace_bytes < need)
    return sla_fail(Status::InvalidArgument, "sla_cuda: workspace of " + std::to_string(need) + " bytes needed, got " +
                                                 std::to_string(workspace_bytes));
  char* ws = static_cast<char*>(workspace);
  const size_t sel_bytes = align256(sla_block_select_workspace_size(p));
  int32_t* own_lut = reinterpret_cast<int32_t*>(ws + sel_bytes);
  void* lin_ws = ws + sel_bytes + align256(lut_bytes(p));
  int32_t* use_lut = lut ? lut : own_lut;
  const int64_t n_sel = sla_selected_blocks(p.topk, p.key_blocks());
  if (Status s = sla_block_select_cuda(p, q, k, block_map, use_lut, ws, sel_bytes, stream); s != Status::Ok) return s;
  if (Status s = sla_sparse_cuda(p, q, k, v, use_lut, n_sel, o, lse, stream); s != Status::Ok) return s;
  if (!proj_weight) return Status::Ok;
  return sla_linear_add_cuda(p, q, k, v, proj_weight, proj_bias, proj_type, o, lin_ws,
                             align256(sla_linear_workspace_size(p)), stream);
}

Status sla_stream_wait(void* waiting, void* source, void* event) {
  const auto ev = static_cast<cudaEvent_t>(event);
  cudaError_t e = cudaEventRecord(ev, static_cast<cudaStream_t>(source));
  if (e == cudaSuccess) e = cudaStreamWaitEvent(static_cast<cudaStream_t>(waiting), ev, 0);
  if (e == cudaSuccess) return Status::Ok;
  return detail::sla_fail(Status::LaunchFailed, std::string("sla_stream_wait: ") + cudaGetErrorString(e));
}

}  // namespace td::kernels
