// Video output: MP4 (H.264, yuv420p) through FFmpeg's libraries, or one PNG
// per frame through libpng from a printf-style pattern ("frames/%04d.png").
// Every file is written under a temporary name in its final directory and
// renamed when complete, so a failure never leaves a half-written file under
// the name the user asked for.
#pragma once
#include <functional>
#include <string>

#include "core/tensor.h"

namespace td::io {

enum class VideoOutputKind { Mp4, PngPattern };

// PngPattern when the path ends in .png and holds one %d / %0Nd conversion;
// Mp4 for .mp4; anything else is a Usage error naming the path.
VideoOutputKind video_output_kind(const std::string& path);

// The name of frame `index` (0-based) of a PNG pattern.
std::string png_frame_name(const std::string& pattern, int64_t index);

// Checks, before any work, that the output can be written: a known kind, its
// directory exists and is writable, the path is not a directory. Io / Usage
// error naming the path otherwise.
void check_video_output(const std::string& path);

// video: [3, F, H, W] f32 host tensor in [-1, 1] (values outside are clamped),
// H and W even. Writes `path` (kind by video_output_kind) at `fps` frames per
// second. `on_frame(i)` is called after frame i is written (progress).
void write_video(const std::string& path, const Tensor& video, int fps = 16,
                 const std::function<void(int64_t)>& on_frame = {});

}  // namespace td::io
