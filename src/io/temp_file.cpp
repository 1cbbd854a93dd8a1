#include "io/temp_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace td::io {

TempFile::TempFile(const std::string& final_path) : final_(final_path) {
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp_ = cat(final_, ".tmp-", ::getpid(), "-", counter++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) return;
    if (errno != EEXIST) break;
  }
  fail(ErrorKind::Io, "cannot create ", tmp_, " (temporary file for ", final_, "): ", std::strerror(errno));
}

TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void TempFile::write(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    TD_CHECK(w > 0, Io, "cannot write ", final_, " (writing ", tmp_, "): ", std::strerror(errno));
    p += w;
    n -= size_t(w);
    pos_ += uint64_t(w);
  }
}

void TempFile::commit() {
  TD_CHECK(::fsync(fd_) == 0, Io, "cannot write ", final_, " (fsync of ", tmp_, "): ", std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  TD_CHECK(rc == 0, Io, "cannot write ", final_, " (close of ", tmp_, "): ", std::strerror(errno));
  TD_CHECK(::rename(tmp_.c_str(), final_.c_str()) == 0, Io, "cannot rename ", tmp_, " to ", final_, ": ",
           std::strerror(errno));
  committed_ = true;
}

}  // namespace td::io
