// The attention core of the T5 / umT5 encoder: for each sample b, head h and
// query i,
//   s_j = q_i . k_j + table[bucket(j - i)][h]   over keys j with key_mask[b][j] != 0
//   out_i = sum_j softmax(s)_j v_j
// with NO 1/sqrt(d) scaling (T5 folds it into the weights) and the softmax in
// fp32. Padded keys are excluded, which is what HF's dtype-minimum fill gives.
//
// Layouts: q, k, v, out [B, L, H, D] contiguous; bias_table f32 [buckets, H]
// (a layer's relative_attention_bias); rel_bucket int32 [2L - 1], the bucket
// of rel = j - i at index rel + L - 1 (computed on the host, so the CPU and
// the GPU use the identical buckets); key_mask int32 [B, L]. Every sample
// needs at least one unmasked key (InvalidArgument otherwise, on the CPU).
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

struct T5AttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  ElemType qkv_type;
  const float* bias_table;
  const int32_t* rel_bucket;
  const int32_t* key_mask;
  void* out;
  ElemType out_type;
  int64_t batch, len, heads, head_dim, num_buckets;
};

// fp32 reference: qkv_type and out_type must be F32.
Status t5_attention_cpu(const T5AttentionArgs& a);

#if TURBODIFF_HAVE_CUDA
// One block per (query, head, sample): scores of all keys in shared memory
// (4 L bytes + 4 D bytes), then PV. q/k/v F32, F16 or BF16 (one type); out
// F32, F16 or BF16. Device pointers throughout.
Status t5_attention_cuda(const T5AttentionArgs& a, void* stream);
#endif

// Sizes and types only (no pointer is read).
Status t5_attention_check(const T5AttentionArgs& a);

}  // namespace td::kernels
