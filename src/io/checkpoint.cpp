#include "io/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/pth.h"
#include "io/safetensors.h"

namespace td::io {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TensorFile read_directory(const fs::path& dir) {
  std::vector<fs::path> indexes, singles;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (ends_with(n, ".safetensors.index.json")) indexes.push_back(e.path());
    else if (ends_with(n, ".safetensors")) singles.push_back(e.path());
  }
  if (indexes.size() == 1) return read_safetensors_sharded(indexes[0].string());
  if (indexes.size() > 1)
    fail(ErrorKind::Usage, dir.string(), " holds ", indexes.size(),
         " *.safetensors.index.json files; name the one to load");
  if (singles.size() == 1) return read_safetensors(singles[0].string());
  fail(ErrorKind::Usage, dir.string(), " is a folder without a *.safetensors.index.json and with ", singles.size(),
       " .safetensors files; name the file to load");
}

}  // namespace

TensorFile read_tensor_file(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (!fs::exists(p, ec)) fail(ErrorKind::Io, path, ": no such file or directory");
  if (fs::is_directory(p, ec)) return read_directory(p);
  if (ends_with(path, ".index.json")) return read_safetensors_sharded(path);

  // Sniff: a zip archive starts with "PK\3\4"; safetensors with an 8-byte
  // little-endian header length followed by '{'.
  unsigned char head[9] = {0};
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorKind::Io, "cannot open ", path);
  f.read(reinterpret_cast<char*>(head), sizeof head);
  const auto got = f.gcount();
  if (got >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) return read_pth(path);
  if (got == 9 && head[8] == '{') return read_safetensors(path);
  if (got >= 2 && head[0] == 0x80 && head[1] <= 5) return read_pth(path);  // a raw pickle: read_pth says why not
  if (ends_with(path, ".safetensors")) return read_safetensors(path);    // let the parser name the problem
  if (ends_with(path, ".pth") || ends_with(path, ".pt") || ends_with(path, ".bin") || ends_with(path, ".ckpt"))
    return read_pth(path);
  fail(ErrorKind::Format, path, ": not a safetensors file, a safetensors index or a PyTorch zip checkpoint (first bytes ",
       got >= 4 ? cat(int(head[0]), " ", int(head[1]), " ", int(head[2]), " ", int(head[3])) : "too short", ")");
}

}  // namespace td::io
