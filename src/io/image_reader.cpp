#include "io/image_reader.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

// stb_image from Debian's libstb-dev: the implementation is compiled here,
// once, so the binaries do not need libstb.so at run time (the GPU machine
// has none). Its own code is not ours to warn about.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_NO_STDIO
#define STBI_MAX_DIMENSIONS 16384
#define STBI_FAILURE_USERMSG
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

namespace td::io {

RgbImage decode_image_rgb(const uint8_t* data, size_t size, const std::string& what) {
  TD_CHECK(size > 0, Format, "image ", what, " is empty");
  TD_CHECK(size <= size_t(INT32_MAX), Format, "image ", what, " is larger than 2 GB");
  int w = 0, h = 0, channels = 0;
  if (!stbi_info_from_memory(data, int(size), &w, &h, &channels))
    fail(ErrorKind::Format, "image ", what, " cannot be decoded (", stbi_failure_reason(),
         "); expected a PNG or JPEG file");
  TD_CHECK(w >= 1 && h >= 1 && w <= kMaxImageSide && h <= kMaxImageSide, Format, "image ", what, " is ", w, "x", h,
           "; expected sides between 1 and ", kMaxImageSide, " pixels");
  stbi_uc* pixels = stbi_load_from_memory(data, int(size), &w, &h, &channels, 3);
  if (!pixels)
    fail(ErrorKind::Format, "image ", what, " cannot be decoded (", stbi_failure_reason(),
         "); expected a PNG or JPEG file");
  RgbImage img;
  img.width = w;
  img.height = h;
  img.rgb.assign(pixels, pixels + size_t(w) * size_t(h) * 3);
  stbi_image_free(pixels);
  return img;
}

RgbImage read_image_rgb(const std::string& path) {
  std::error_code ec;
  TD_CHECK(std::filesystem::exists(path, ec), Io, "image ", path, " does not exist");
  TD_CHECK(!std::filesystem::is_directory(path, ec), Io, "image ", path, " is a directory, not an image file");
  std::ifstream f(path, std::ios::binary);
  TD_CHECK(f.good(), Io, "image ", path, " cannot be opened: ", std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  TD_CHECK(!f.bad(), Io, "image ", path, " cannot be read: ", std::strerror(errno));
  return decode_image_rgb(bytes.data(), bytes.size(), path);
}

}  // namespace td::io
