#include "io/video_writer.h"

#include <dlfcn.h>
#include <png.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <type_traits>
#include <vector>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}

#include "core/error.h"

namespace td::io {
namespace fs = std::filesystem;
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  if (s.size() < suffix.size()) return false;
  std::string tail = s.substr(s.size() - suffix.size());
  std::transform(tail.begin(), tail.end(), tail.begin(), [](unsigned char c) { return std::tolower(c); });
  return tail == suffix;
}

// The position and zero-pad width of the single %d / %0Nd conversion of a
// pattern; -1 position when there is none. Parsed here rather than passed to
// printf: the pattern is user input.
struct PatternConversion {
  size_t pos = std::string::npos, len = 0;
  int width = 0;
};

PatternConversion find_conversion(const std::string& pattern) {
  PatternConversion found;
  int count = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') continue;
    size_t j = i + 1;
    if (j < pattern.size() && pattern[j] == '%') {  // literal %
      i = j;
      continue;
    }
    int width = 0;
    bool zero = j < pattern.size() && pattern[j] == '0';
    if (zero) ++j;
    while (j < pattern.size() && std::isdigit(static_cast<unsigned char>(pattern[j])))
      width = width * 10 + (pattern[j++] - '0');
    if (j >= pattern.size() || pattern[j] != 'd' || (width > 0 && !zero) || width > 9)
      fail(ErrorKind::Usage, "output pattern ", pattern, ": '%' must start a %d or %0Nd conversion (N <= 9)");
    ++count;
    found = {i, j + 1 - i, width};
    i = j;
  }
  if (count > 1) fail(ErrorKind::Usage, "output pattern ", pattern, ": expected one %d conversion, found ", count);
  return found;
}

std::string unescape_percent(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    out += s[i];
    if (s[i] == '%' && i + 1 < s.size() && s[i + 1] == '%') ++i;
  }
  return out;
}

// A temporary name beside `path` (same directory, so rename is atomic).
std::string temp_name_for(const std::string& path) {
  const fs::path p(path);
  std::string tmp(1, '.');  // appended piecewise: GCC 12 warns falsely (-Wrestrict) on "." + string
  tmp += p.filename().string();
  tmp += ".tmp";
  tmp += std::to_string(::getpid());
  return (p.parent_path() / tmp).string();
}

// Frame f of video [3, F, H, W] in [-1, 1] as packed RGB24.
void frame_rgb(const Tensor& video, int64_t f, std::vector<uint8_t>& rgb) {
  const int64_t frames = video.shape()[1], h = video.shape()[2], w = video.shape()[3];
  const float* base = video.data<float>();
  rgb.resize(size_t(h * w * 3));
  for (int64_t c = 0; c < 3; ++c) {
    const float* plane = base + (c * frames + f) * h * w;
    for (int64_t i = 0; i < h * w; ++i) {
      const float v = std::clamp((plane[i] + 1.0f) * 127.5f, 0.0f, 255.0f);
      rgb[size_t(i * 3 + c)] = static_cast<uint8_t>(std::lround(std::isnan(v) ? 0.0f : v));
    }
  }
}

void write_png(const std::string& path, const uint8_t* rgb, int64_t w, int64_t h) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail(ErrorKind::Io, "cannot create ", path, ": ", std::strerror(errno));
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_write_struct(&png, nullptr);
    std::fclose(f);
    fail(ErrorKind::Io, "libpng: cannot allocate a writer for ", path);
  }
  // libpng reports errors by longjmp; nothing with a destructor lives in this frame past this point.
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    fail(ErrorKind::Io, "libpng: failed writing ", path);
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, png_uint_32(w), png_uint_32(h), 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int64_t y = 0; y < h; ++y) png_write_row(png, const_cast<uint8_t*>(rgb + y * w * 3));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  if (std::fclose(f) != 0) fail(ErrorKind::Io, "cannot finish writing ", path, ": ", std::strerror(errno));
}


// FFmpeg is opened at run time (dlopen), not linked: the binaries then start
// on machines without FFmpeg (the GPU test machine's image has another FFmpeg
// ABI or none), and only MP4 output needs it. The sonames follow the major
// versions of the headers this was built with, so the ABI matches them.
struct FFmpeg {
#define TD_FF(name) decltype(&::name) name = nullptr
  TD_FF(avformat_alloc_output_context2); TD_FF(avformat_new_stream); TD_FF(avio_open); TD_FF(avio_closep);
  TD_FF(avformat_write_header); TD_FF(av_interleaved_write_frame); TD_FF(av_write_trailer);
  TD_FF(avformat_free_context);
  TD_FF(avcodec_find_encoder_by_name); TD_FF(avcodec_find_encoder); TD_FF(avcodec_alloc_context3);
  TD_FF(avcodec_open2); TD_FF(avcodec_parameters_from_context); TD_FF(av_packet_alloc); TD_FF(av_packet_free);
  TD_FF(avcodec_send_frame); TD_FF(avcodec_receive_packet); TD_FF(av_packet_rescale_ts);
  TD_FF(avcodec_free_context);
  TD_FF(av_opt_set); TD_FF(av_frame_alloc); TD_FF(av_frame_free); TD_FF(av_frame_get_buffer);
  TD_FF(av_frame_make_writable); TD_FF(av_strerror); TD_FF(av_log_set_level);
  TD_FF(sws_getContext); TD_FF(sws_scale); TD_FF(sws_freeContext);
#undef TD_FF
  std::string error;  // why it could not be loaded; "" when loaded
};

const FFmpeg& ffmpeg() {
  static const FFmpeg ff = [] {
    FFmpeg f;
    auto open = [&f](const std::string& soname) -> void* {
      void* h = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (!h && f.error.empty()) f.error = cat("cannot load ", soname, " (", ::dlerror(), ")");
      return h;
    };
    void* avutil = open(cat("libavutil.so.", LIBAVUTIL_VERSION_MAJOR));
    void* swscale = open(cat("libswscale.so.", LIBSWSCALE_VERSION_MAJOR));
    void* avcodec = open(cat("libavcodec.so.", LIBAVCODEC_VERSION_MAJOR));
    void* avformat = open(cat("libavformat.so.", LIBAVFORMAT_VERSION_MAJOR));
    if (!f.error.empty()) return f;
    auto get = [&f](void* h, const char* name, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
      if (!fn && f.error.empty()) f.error = cat("FFmpeg library has no symbol ", name);
    };
#define TD_GET(lib, name) get(lib, #name, f.name)
    TD_GET(avformat, avformat_alloc_output_context2); TD_GET(avformat, avformat_new_stream);
    TD_GET(avformat, avio_open); TD_GET(avformat, avio_closep); TD_GET(avformat, avformat_write_header);
    TD_GET(avformat, av_interleaved_write_frame); TD_GET(avformat, av_write_trailer);
    TD_GET(avformat, avformat_free_context);
    TD_GET(avcodec, avcodec_find_encoder_by_name); TD_GET(avcodec, avcodec_find_encoder);
    TD_GET(avcodec, avcodec_alloc_context3); TD_GET(avcodec, avcodec_open2);
    TD_GET(avcodec, avcodec_parameters_from_context); TD_GET(avcodec, av_packet_alloc);
    TD_GET(avcodec, av_packet_free); TD_GET(avcodec, avcodec_send_frame); TD_GET(avcodec, avcodec_receive_packet);
    TD_GET(avcodec, av_packet_rescale_ts); TD_GET(avcodec, avcodec_free_context);
    TD_GET(avutil, av_opt_set); TD_GET(avutil, av_frame_alloc); TD_GET(avutil, av_frame_free);
    TD_GET(avutil, av_frame_get_buffer); TD_GET(avutil, av_frame_make_writable); TD_GET(avutil, av_strerror);
    TD_GET(avutil, av_log_set_level);
    TD_GET(swscale, sws_getContext); TD_GET(swscale, sws_scale); TD_GET(swscale, sws_freeContext);
#undef TD_GET
    return f;
  }();
  return ff;
}

std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  ffmpeg().av_strerror(code, buf, sizeof buf);
  return buf;
}

// Owns the FFmpeg objects of one MP4 being written.
struct Mp4Encoder {
  AVFormatContext* fmt = nullptr;
  AVCodecContext* codec = nullptr;
  AVFrame* frame = nullptr;
  AVPacket* packet = nullptr;
  SwsContext* sws = nullptr;
  bool opened_io = false;
  ~Mp4Encoder() {
    ffmpeg().sws_freeContext(sws);
    ffmpeg().av_packet_free(&packet);
    ffmpeg().av_frame_free(&frame);
    ffmpeg().avcodec_free_context(&codec);
    if (fmt && opened_io) ffmpeg().avio_closep(&fmt->pb);
    ffmpeg().avformat_free_context(fmt);
  }
};

void drain(Mp4Encoder& e, AVStream* stream, const std::string& path) {
  for (;;) {
    int r = ffmpeg().avcodec_receive_packet(e.codec, e.packet);
    if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return;
    if (r < 0) fail(ErrorKind::Io, "H.264 encoder failed on ", path, ": ", av_error(r));
    ffmpeg().av_packet_rescale_ts(e.packet, e.codec->time_base, stream->time_base);
    e.packet->stream_index = stream->index;
    r = ffmpeg().av_interleaved_write_frame(e.fmt, e.packet);
    if (r < 0) fail(ErrorKind::Io, "cannot write a packet to ", path, ": ", av_error(r));
  }
}

void write_mp4(const std::string& tmp, const std::string& path, const Tensor& video, int fps,
               const std::function<void(int64_t)>& on_frame) {
  const int64_t frames = video.shape()[1], h = video.shape()[2], w = video.shape()[3];
  if (!ffmpeg().error.empty())
    fail(ErrorKind::Unsupported, "MP4 output ", path, " needs FFmpeg's libraries (Debian libavformat59, libavcodec59, "
         "libswscale6): ", ffmpeg().error, "; a %04d.png frame pattern works without them");
  // libx264 prints its settings and statistics at the default level; only errors matter here.
  ffmpeg().av_log_set_level(AV_LOG_ERROR);
  Mp4Encoder e;
  int r = ffmpeg().avformat_alloc_output_context2(&e.fmt, nullptr, "mp4", tmp.c_str());
  if (r < 0 || !e.fmt) fail(ErrorKind::Io, "FFmpeg has no mp4 muxer for ", path, ": ", av_error(r));
  const AVCodec* codec = ffmpeg().avcodec_find_encoder_by_name("libx264");
  if (!codec) codec = ffmpeg().avcodec_find_encoder(AV_CODEC_ID_H264);
  if (!codec) fail(ErrorKind::Unsupported, "this FFmpeg has no H.264 encoder (libx264) for ", path);
  AVStream* stream = ffmpeg().avformat_new_stream(e.fmt, nullptr);
  e.codec = ffmpeg().avcodec_alloc_context3(codec);
  if (!stream || !e.codec) fail(ErrorKind::Io, "FFmpeg: out of memory setting up ", path);
  e.codec->width = int(w);
  e.codec->height = int(h);
  e.codec->pix_fmt = AV_PIX_FMT_YUV420P;
  e.codec->time_base = AVRational{1, fps};
  e.codec->framerate = AVRational{fps, 1};
  e.codec->gop_size = 16;
  if (e.fmt->oformat->flags & AVFMT_GLOBALHEADER) e.codec->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  // Visually lossless; the default preset. The thread count stays FFmpeg's choice.
  ffmpeg().av_opt_set(e.codec->priv_data, "crf", "17", 0);
  r = ffmpeg().avcodec_open2(e.codec, codec, nullptr);
  if (r < 0) fail(ErrorKind::Io, "cannot open the H.264 encoder for ", path, " (", w, "x", h, "): ", av_error(r));
  r = ffmpeg().avcodec_parameters_from_context(stream->codecpar, e.codec);
  if (r < 0) fail(ErrorKind::Io, "FFmpeg: stream parameters for ", path, ": ", av_error(r));
  stream->time_base = e.codec->time_base;
  stream->avg_frame_rate = AVRational{fps, 1};
  r = ffmpeg().avio_open(&e.fmt->pb, tmp.c_str(), AVIO_FLAG_WRITE);
  if (r < 0) fail(ErrorKind::Io, "cannot create ", tmp, " (for ", path, "): ", av_error(r));
  e.opened_io = true;
  r = ffmpeg().avformat_write_header(e.fmt, nullptr);
  if (r < 0) fail(ErrorKind::Io, "cannot write the MP4 header of ", path, ": ", av_error(r));

  e.frame = ffmpeg().av_frame_alloc();
  e.packet = ffmpeg().av_packet_alloc();
  if (!e.frame || !e.packet) fail(ErrorKind::Io, "FFmpeg: out of memory encoding ", path);
  e.frame->format = AV_PIX_FMT_YUV420P;
  e.frame->width = int(w);
  e.frame->height = int(h);
  r = ffmpeg().av_frame_get_buffer(e.frame, 0);
  if (r < 0) fail(ErrorKind::Io, "FFmpeg: frame buffer for ", path, ": ", av_error(r));
  e.sws = ffmpeg().sws_getContext(int(w), int(h), AV_PIX_FMT_RGB24, int(w), int(h), AV_PIX_FMT_YUV420P, SWS_BICUBIC, nullptr,
                         nullptr, nullptr);
  if (!e.sws) fail(ErrorKind::Io, "FFmpeg: no RGB -> yuv420p converter for ", w, "x", h);
  std::vector<uint8_t> rgb;
  for (int64_t f = 0; f < frames; ++f) {
    frame_rgb(video, f, rgb);
    r = ffmpeg().av_frame_make_writable(e.frame);
    if (r < 0) fail(ErrorKind::Io, "FFmpeg: frame not writable: ", av_error(r));
    const uint8_t* src[1] = {rgb.data()};
    const int src_stride[1] = {int(w * 3)};
    ffmpeg().sws_scale(e.sws, src, src_stride, 0, int(h), e.frame->data, e.frame->linesize);
    e.frame->pts = f;
    r = ffmpeg().avcodec_send_frame(e.codec, e.frame);
    if (r < 0) fail(ErrorKind::Io, "H.264 encoder rejected frame ", f, " of ", path, ": ", av_error(r));
    drain(e, stream, path);
    if (on_frame) on_frame(f);
  }
  r = ffmpeg().avcodec_send_frame(e.codec, nullptr);
  if (r < 0) fail(ErrorKind::Io, "H.264 encoder flush failed for ", path, ": ", av_error(r));
  drain(e, stream, path);
  r = ffmpeg().av_write_trailer(e.fmt);
  if (r < 0) fail(ErrorKind::Io, "cannot write the MP4 trailer of ", path, ": ", av_error(r));
  ffmpeg().avio_closep(&e.fmt->pb);
  e.opened_io = false;
}

}  // namespace

VideoOutputKind video_output_kind(const std::string& path) {
  if (ends_with(path, ".mp4")) {
    if (find_conversion(path).pos != std::string::npos)
      fail(ErrorKind::Usage, "output ", path, ": a %d pattern is for PNG frames (e.g. frames/%04d.png), not .mp4");
    return VideoOutputKind::Mp4;
  }
  if (ends_with(path, ".png")) {
    if (find_conversion(path).pos == std::string::npos)
      fail(ErrorKind::Usage, "output ", path, ": PNG output is a frame pattern with one %d (e.g. frames/%04d.png)");
    return VideoOutputKind::PngPattern;
  }
  fail(ErrorKind::Usage, "output ", path, ": expected a .mp4 file or a %04d.png frame pattern");
}

std::string png_frame_name(const std::string& pattern, int64_t index) {
  const PatternConversion c = find_conversion(pattern);
  TD_CHECK(c.pos != std::string::npos, Usage, "output pattern ", pattern, " has no %d conversion");
  std::string num = std::to_string(index);
  if (int(num.size()) < c.width) num.insert(0, size_t(c.width) - num.size(), '0');
  return unescape_percent(pattern.substr(0, c.pos)) + num + unescape_percent(pattern.substr(c.pos + c.len));
}

void check_video_output(const std::string& path) {
  const VideoOutputKind kind = video_output_kind(path);
  const std::string target = kind == VideoOutputKind::Mp4 ? path : png_frame_name(path, 0);
  const fs::path p(target);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(ErrorKind::Io, "output ", path, ": directory ", dir.string(), " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    fail(ErrorKind::Io, "output ", path, ": directory ", dir.string(), " is not writable (", std::strerror(errno), ")");
  if (fs::is_directory(p, ec)) fail(ErrorKind::Io, "output ", path, " is a directory");
}

void write_video(const std::string& path, const Tensor& video, int fps,
                 const std::function<void(int64_t)>& on_frame) {
  TD_CHECK(video.device().is_cpu() && video.dtype() == DType::F32 && video.is_contiguous() &&
               video.shape().size() == 4 && video.shape()[0] == 3,
           Shape, "write_video ", path, ": expected a contiguous f32 host video [3, F, H, W], got ",
           shape_str(video.shape()), " ", dtype_name(video.dtype()));
  const int64_t frames = video.shape()[1], h = video.shape()[2], w = video.shape()[3];
  TD_CHECK(frames >= 1 && h >= 2 && w >= 2 && h % 2 == 0 && w % 2 == 0, Shape, "write_video ", path,
           ": frames must be >= 1 and height/width even (yuv420p), got ", frames, " frames of ", w, "x", h);
  TD_CHECK(fps >= 1, Usage, "write_video ", path, ": fps must be >= 1, got ", fps);
  const VideoOutputKind kind = video_output_kind(path);
  if (kind == VideoOutputKind::Mp4) {
    const std::string tmp = temp_name_for(path);
    try {
      write_mp4(tmp, path, video, fps, on_frame);
    } catch (...) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw;
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
      fs::remove(tmp, ec);
      fail(ErrorKind::Io, "cannot rename ", tmp, " to ", path, ": ", ec.message());
    }
    return;
  }
  // PNG frames: all written under temporary names first, then renamed, so a
  // failure part-way leaves no frame files under the pattern's names.
  std::vector<std::string> temps;
  auto remove_temps = [&] {
    std::error_code ec;
    for (const auto& t : temps) fs::remove(t, ec);
  };
  try {
    std::vector<uint8_t> rgb;
    for (int64_t f = 0; f < frames; ++f) {
      const std::string name = png_frame_name(path, f);
      temps.push_back(temp_name_for(name));
      frame_rgb(video, f, rgb);
      write_png(temps.back(), rgb.data(), w, h);
      if (on_frame) on_frame(f);
    }
  } catch (...) {
    remove_temps();
    throw;
  }
  for (int64_t f = 0; f < frames; ++f) {
    std::error_code ec;
    fs::rename(temps[size_t(f)], png_frame_name(path, f), ec);
    if (ec) {
      remove_temps();
      fail(ErrorKind::Io, "cannot rename ", temps[size_t(f)], " to ", png_frame_name(path, f), ": ", ec.message());
    }
  }
}

}  // namespace td::io
