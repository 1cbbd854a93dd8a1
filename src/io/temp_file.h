// A file written under a temporary name beside its final path (same
// directory, so the final rename is atomic) and removed unless committed: no
// reader ever sees a half-written checkpoint under the final name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace td::io {

class TempFile {
 public:
  // Creates `<final_path>.tmp-<pid>-<n>`; throws td::Error(Io) naming both paths.
  explicit TempFile(const std::string& final_path);
  ~TempFile();  // removes the temporary file unless commit() succeeded
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const void* data, size_t n);
  uint64_t pos() const { return pos_; }  // bytes written so far
  // Flushes to disk and moves the file under its final name.
  void commit();

 private:
  std::string final_, tmp_;
  int fd_ = -1;
  uint64_t pos_ = 0;
  bool committed_ = false;
};

}  // namespace td::io
