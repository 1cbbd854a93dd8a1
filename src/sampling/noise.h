// Deterministic Gaussian noise from a counter-based generator, so a seed gives
// the same latent noise on any machine, with any thread count, and (with the
// same formulas in a CUDA kernel) on the GPU.
//
// Generator: Philox4x32-10 (Salmon et al., SC'11; checked against Random123's
// known-answer vectors in tests/cpu/test_sampling.cpp).
//
// Stream layout. Normal number j (0-based flat index into a contiguous tensor)
// of stream `stream` under seed `seed` is lane j % 4 of
//   philox4x32_10(counter = {b lo32, b hi32, stream lo32, stream hi32},
//                 key     = {seed lo32, seed hi32}),   b = j / 4,
// turned into normals by Box-Muller on pairs of lanes: with the 32-bit words
// c0..c3 of that block and u(c) = (c + 0.5) / 2^32 (in (0, 1), so log is finite),
//   r = sqrt(-2 ln u(c0)), theta = 2 pi u(c1): lane 0 = r cos theta, lane 1 = r sin theta,
// and the same with c2, c3 for lanes 2 and 3. Computed in double, rounded to
// float32 (the reference samplers draw float32 noise and upcast it).
// Streams used by the samplers (sampling/samplers.h): 0 = the initial latent
// noise; 1 + k = the fresh noise of rCM step k.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace td::sampling {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// One Philox4x32 block with 10 rounds.
PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key);

// Normal number `index` of (seed, stream), as described above.
float normal_at(uint64_t seed, uint64_t stream, uint64_t index);

// out[i] = normal_at(seed, stream, first + i) for i in [0, n). The values do not
// depend on how `pool` splits the range.
void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t first = 0,
                 ThreadPool& pool = ThreadPool::global());

// A contiguous host tensor of the given shape and float dtype (F32, F64, BF16,
// F16) holding stream `stream` of `seed` (converted from the float32 values).
Tensor randn(const Shape& shape, uint64_t seed, uint64_t stream, DType dtype = DType::F32,
             ThreadPool& pool = ThreadPool::global());

// A batch [N, ...] whose sample k is randn(shape[1:], seeds[k], stream): the
// noise a one-sample run of seed seeds[k] draws (generate's --num-samples
// batched through the DiT). seeds.size() must equal shape[0].
Tensor randn_per_sample(const Shape& shape, const std::vector<uint64_t>& seeds, uint64_t stream,
                        DType dtype = DType::F32, ThreadPool& pool = ThreadPool::global());

}  // namespace td::sampling
