// Exact softmax attention (`--attention original`), no mask:
//
//   S[b, h, i, j] = scale * <Q[b, h, i, :], K[b, h, j, :]>
//   O[b, h, i, :] = sum_j softmax_j(S[b, h, i, :]) * V[b, h, j, :]
//   LSE[b, h, i]  = ln sum_j exp(S[b, h, i, j])      (natural log, fp32)
//
// Q and O have len_q tokens, K and V len_kv (Wan's cross-attention has
// len_kv = 512 text tokens). The same head count for Q and K/V.
//
// Backends, all with the same contract:
//   attention_cpu         fp32 reference (any head_dim, F32/F16/BF16 in and out)
//   attention_flash_cuda  portable flash-attention forward for sm_80+ (mma.sync,
//                         BF16, head_dim 64/128): the fallback where cuDNN is
//                         absent or refuses
//   attention_cudnn       cuDNN's fused SDPA through the cuDNN frontend graph API
//                         (BF16), built once per problem and cached
//
// Kernels are framework-free: raw pointers, a stream, a Status. When a call
// returns anything but Ok, attention_last_error() says why (thread-local), so
// the ops layer can report it or fall back to another backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/status.h"

namespace td::kernels {

// Where element (b, h, t, c) of a Q/K/V/O tensor lies, in elements from its
// base pointer: b*batch + h*head + t*token + c. Channels are always contiguous.
struct AttnStrides {
  int64_t batch = 0, head = 0, token = 0;
};

// The two memory orders the model code produces: (B, L, H, D) straight out of
// the QKV projections, and (B, H, L, D) as PyTorch's SDPA takes it.
enum class AttnLayout { BLHD, BHLD };

// Strides of a contiguous tensor of `len` tokens in `layout`.
AttnStrides attn_contiguous_strides(AttnLayout layout, int64_t heads, int64_t len, int64_t head_dim);

struct AttnProblem {
  int64_t batch = 0, heads = 0, len_q = 0, len_kv = 0, head_dim = 0;
  AttnStrides q, k, v, o;
  float scale = 0;                      // softmax scale, > 0; make() uses 1/sqrt(head_dim)
  ElemType qkv_type = ElemType::BF16;   // element type of Q, K and V
  ElemType o_type = ElemType::BF16;     // element type of O

  // Contiguous Q, K, V, O in `layout`, scale 1/sqrt(head_dim).
  static AttnProblem make(AttnLayout layout, int64_t batch, int64_t heads, int64_t len_q, int64_t len_kv,
                          int64_t head_dim, ElemType io_type = ElemType::BF16);
};

// The checks every backend runs first: positive sizes, non-negative strides, a
// finite positive scale, F32/F16/BF16 element types. InvalidArgument otherwise.
Status attention_check(const AttnProblem& p);

// Why the last attention call on this thread did not return Ok ("" after an Ok call).
const char* attention_last_error();

// Number of fp32 LSE values a call writes: batch * heads * len_q, laid out
// [batch, heads, len_q] contiguous. `lse` may be null on every backend.
inline int64_t attention_lse_count(const AttnProblem& p) { return p.batch * p.heads * p.len_q; }

// fp32 reference on the host: scores and softmax in fp32 with the maximum
// subtracted, row sums in fp64, P·V in fp32. Multi-threaded over (batch, head,
// query tile) with td::parallel_for. Host pointers.
Status attention_cpu(const AttnProblem& p, const void* q, const void* k, const void* v, void* o, float* lse);

#if TURBODIFF_HAVE_CUDA
// Whether the portable kernel takes this problem (Ok) or why not (Unsupported,
// reason in attention_last_error()): BF16 in and out, head_dim 64 or 128,
// strides multiples of 8 elements. Pointer alignment (16 bytes) is checked at the call.
Status attention_flash_supports(const AttnProblem& p);
// The portable flash-attention forward (sm_80 and newer). Device pointers on the
// current device; `stream` is a cudaStream_t. Needs no workspace.
Status attention_flash_cuda(const AttnProblem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                            void* stream);
// The same kernel, block-sparse (SLA's sparse branch, kernels/sla): query block
// i of 128 rows attends only to the n_sel key blocks of 64 keys listed in
// lut[b, h, i, :] (int32 [B, H, ceil(len_q / 128), n_sel] on the device, distinct
// indices in [0, ceil(len_kv / 64)), any order; not checked on the device).
// The LSE covers the selected keys only.
Status attention_flash_block_sparse_cuda(const AttnProblem& p, const void* q, const void* k, const void* v, void* o,
                                         float* lse, const int32_t* lut, int64_t n_sel, void* stream);
#endif

#if TURBODIFF_HAVE_CUDNN
// Builds (or finds in the cache) the cuDNN plan for this problem on the current
// device and reports the workspace it needs. with_lse: whether the call will
// ask for the LSE (a different graph). Unsupported when cuDNN refuses the problem.
Status attention_cudnn_workspace_size(const AttnProblem& p, bool with_lse, size_t* bytes);
// cuDNN fused SDPA forward: BF16 Q/K/V/O, fp32 LSE when `lse` is non-null.
// `workspace` must hold attention_cudnn_workspace_size() bytes (null if 0).
// Device pointers on the current device; `stream` is a cudaStream_t.
Status attention_cudnn(const AttnProblem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                       void* workspace, size_t workspace_bytes, void* stream);
// Number of distinct plans built so far (tests check that a shape is built once).
size_t attention_cudnn_cached_plans();
#endif

namespace detail {
// Records the reason a call failed for attention_last_error(); returns `s` so a
// failing check can be `return attn_fail(Status::X, "...")`.
Status attn_fail(Status s, const std::string& message);
void attn_clear_error();
}  // namespace detail

}  // namespace td::kernels
