// A minimal torch.save-compatible writer for plain state dicts: an ordered
// name -> tensor map, written as PyTorch's zip format (the one torch.load
// reads since PyTorch 1.6, and io/pth.h reads back):
//   <prefix>/data.pkl      pickle protocol 2 of a collections.OrderedDict whose
//                          values are torch._utils._rebuild_tensor_v2(...)
//                          calls on persistent storage ids
//                          ('storage', torch.<Type>Storage, '<i>', 'cpu', numel)
//   <prefix>/byteorder     "little"
//   <prefix>/data/<i>      the bytes of tensor i (one storage per tensor,
//                          contiguous, 64-byte aligned in the file)
//   <prefix>/version       "3"
// Entries are stored (not compressed) with CRC-32s; ZIP64 records are used
// when a size or offset passes 4 GiB. Only what a state dict needs: no shared
// storages, no nested containers, no non-tensor values.
//
// Dtypes: f32, f64, f16, bf16, i8, u8, i16, i32, i64, bool. Host tensors only
// (non-contiguous ones are written contiguous). The file appears atomically:
// written under a temporary name beside `path`, renamed when complete.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace td::io {

// `archive_name`: the zip's top folder (torch.save uses the file's stem; any
// name loads). Duplicate tensor names and device tensors are errors.
void write_pth(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
               const std::string& archive_name = "archive");

namespace detail {
// Tests only: sizes and offsets at or above `bytes` (clamped to [1, 2^32 - 1])
// are written with ZIP64 records, as they are above 4 GiB, so the ZIP64 paths
// can be checked on small files. Returns the previous threshold (2^32 - 1 by default).
uint64_t set_pth_zip64_threshold_for_tests(uint64_t bytes);
}  // namespace detail

}  // namespace td::io
