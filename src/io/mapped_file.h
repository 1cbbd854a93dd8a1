// A read-only memory mapping of a whole file. Shared ownership: tensors that
// view the mapping hold a shared_ptr to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace td::io {

class MappedFile {
 public:
  // Maps `path` read-only; throws td::Error(Io) naming the file on failure.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace td::io
