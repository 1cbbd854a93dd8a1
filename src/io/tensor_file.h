// What every checkpoint reader returns: the tensors of a file (or of a sharded
// set of files) in file order, as host Tensors that view the file's bytes
// directly (zero-copy; the mapping stays alive while any tensor does).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace td::io {

struct TensorFile {
  std::string path;    // the file (or index JSON) that was opened
  std::string format;  // "safetensors", "safetensors-sharded", "pth"
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;  // safetensors __metadata__, pth notes

  const Tensor* find(std::string_view name) const;
  size_t total_bytes() const;
};

}  // namespace td::io
