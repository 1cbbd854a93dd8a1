// safetensors reader and writer.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON (an object
// mapping tensor names to {"dtype", "shape", "data_offsets": [begin, end]} and an
// optional "__metadata__" of string pairs), then the data region, which the
// offsets index. The reader validates every field against the file and returns
// host tensors that view the mapped bytes (zero-copy); the writer produces files
// the Python `safetensors` library accepts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/tensor_file.h"

namespace td::io {

// Largest header accepted, as in the reference implementation: a bigger one is
// a corrupt length field, not a real checkpoint.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Maps `path` and parses it. Throws td::Error (Io, Format) naming the file, the
// tensor and the expected vs found value on any problem.
TensorFile read_safetensors(const std::string& path);

// Parses a safetensors image already in memory. `owner` keeps [data, data+size)
// alive; every returned tensor holds it. `name_for_errors` prefixes messages
// and becomes TensorFile::path. Tensors come in data-offset order. A tensor
// whose bytes are not aligned to its element size (possible in files from other
// writers) is copied into aligned host memory instead of viewed, so typed
// access to it is well defined.
TensorFile parse_safetensors(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                             const std::string& name_for_errors);

// Reads a Hugging Face / diffusers `*.safetensors.index.json` ({"weight_map":
// {tensor: shard file}, "metadata": {...}}). Shards are resolved relative to the
// index's directory. Checks that every listed tensor is in its shard, that no
// tensor appears in two shards and that no shard holds tensors the weight map
// does not list. Tensors come shard by shard (shards in file-name order), each
// shard in data-offset order; metadata is the index's "metadata" (non-string
// values as JSON text) plus the shards' __metadata__ keys not already present.
TensorFile read_safetensors_sharded(const std::string& index_json_path);

// Writes host tensors of any dtype (non-contiguous ones are copied contiguous).
// The header is padded with spaces so the data region starts 8-byte aligned.
// Tensors are laid out without gaps (the reference reader rejects gaps), in
// decreasing element size and otherwise in the given order, so each starts
// aligned to its element size. The file is written under a temporary name in
// the same directory and renamed into place only when complete; on failure the
// temporary is removed and no file appears under `path`.
// Duplicate names, "__metadata__" as a tensor name and device tensors are errors.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace td::io
