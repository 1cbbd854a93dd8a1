// Opens any checkpoint a user may hand turbodiff, deciding the format from the
// path and the file's first bytes: a .safetensors file, a sharded set (its
// *.safetensors.index.json, or a folder holding one or a single .safetensors),
// or a PyTorch .pth/.pt/.bin/.ckpt zip archive.
#pragma once

#include <string>

#include "io/tensor_file.h"

namespace td::io {

TensorFile read_tensor_file(const std::string& path);

}  // namespace td::io
