#include "io/tensor_file.h"

namespace td::io {

const Tensor* TensorFile::find(std::string_view name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

size_t TensorFile::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : tensors) n += t.nbytes();
  return n;
}

}  // namespace td::io
