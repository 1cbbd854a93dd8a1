// Still images in: PNG, JPEG (and the other formats stb_image decodes: BMP,
// TGA, GIF's first frame, PSD composite, HDR, PNM) as 8-bit RGB, through
// Debian's stb_image header (libstb-dev, scripts/setup.sh). Grey images are
// replicated to RGB; an alpha channel is dropped (PIL's convert("RGB"), which
// TurboDiffusion's I2V script applies, does the same); 16-bit PNGs are reduced
// to 8 bits. EXIF orientation is ignored, as PIL's Image.open does.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace td::io {

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // height * width * 3, row-major, RGB interleaved
  uint8_t at(int64_t y, int64_t x, int c) const { return rgb[size_t((y * width + x) * 3 + c)]; }
};

// Largest side accepted (a guard against decompression bombs and absurd inputs).
inline constexpr int64_t kMaxImageSide = 16384;

// Reads `path`. Io error naming the file when it is missing or cannot be read;
// Format error naming the file and stb's reason when it is not a decodable
// image (or is larger than kMaxImageSide on a side).
RgbImage read_image_rgb(const std::string& path);

// Decodes an image held in memory; `what` names it in errors.
RgbImage decode_image_rgb(const uint8_t* data, size_t size, const std::string& what);

}  // namespace td::io
