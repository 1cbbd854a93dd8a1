#include "models/umt5/umt5_tokenizer.h"

#include <sentencepiece_processor.h>

#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/log.h"

namespace td::models::umt5 {
namespace fs = std::filesystem;
namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

struct Entity {
  const char* name;
  uint32_t cp;
  bool legacy;  // HTML also accepts it without the ';'
};
constexpr Entity kEntities[] = {
    {"amp", '&', true},      {"lt", '<', true},         {"gt", '>', true},         {"quot", '"', true},
    {"apos", '\'', false},   {"nbsp", 0xA0, true},      {"copy", 0xA9, true},      {"reg", 0xAE, true},
    {"trade", 0x2122, false}, {"hellip", 0x2026, false}, {"mdash", 0x2014, false}, {"ndash", 0x2013, false},
    {"lsquo", 0x2018, false}, {"rsquo", 0x2019, false},  {"ldquo", 0x201C, false}, {"rdquo", 0x201D, false},
    {"laquo", 0xAB, true},   {"raquo", 0xBB, true},     {"middot", 0xB7, true},    {"deg", 0xB0, true},
    {"times", 0xD7, true},   {"eacute", 0xE9, true},    {"egrave", 0xE8, true},    {"agrave", 0xE0, true},
    {"uuml", 0xFC, true},    {"ouml", 0xF6, true},      {"auml", 0xE4, true},      {"szlig", 0xDF, true},
    {"euro", 0x20AC, false}, {"pound", 0xA3, true},     {"yen", 0xA5, true},       {"cent", 0xA2, true},
};

// Python's html.unescape rules for a numeric reference: the HTML5 table of
// replaced references (NUL -> U+FFFD, CR -> CR, 0x80-0x9F read as
// Windows-1252), surrogates and values past U+10FFFF -> U+FFFD, and the
// noncharacters / C0-C1 controls HTML forbids dropped.
void append_numeric_reference(std::string& out, uint64_t v) {
  static constexpr uint16_t kCp1252[32] = {0x20AC, 0x81,   0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021,
                                           0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x8D,   0x017D, 0x8F,
                                           0x90,   0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
                                           0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x9D,   0x017E, 0x0178};
  if (v == 0) return append_utf8(out, 0xFFFD);
  if (v == 0x0D) return append_utf8(out, 0x0D);
  if (v >= 0x80 && v <= 0x9F) return append_utf8(out, kCp1252[v - 0x80]);
  if (v >= 0x110000 || (v >= 0xD800 && v <= 0xDFFF)) return append_utf8(out, 0xFFFD);
  const bool dropped = (v >= 0x1 && v <= 0x8) || v == 0xB || (v >= 0xE && v <= 0x1F) || (v >= 0x7F && v <= 0x9F) ||
                       (v >= 0xFDD0 && v <= 0xFDEF) || (v & 0xFFFE) == 0xFFFE;
  if (!dropped) append_utf8(out, uint32_t(v));
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// One pass of HTML character-reference decoding.
std::string html_unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '&') {
      out += s[i++];
      continue;
    }
    // Numeric: &#123; &#x1F600; (the ';' optional, as in Python's html.unescape).
    if (i + 2 < s.size() && s[i + 1] == '#') {
      const bool hex = s[i + 2] == 'x' || s[i + 2] == 'X';
      size_t j = i + (hex ? 3 : 2);
      uint64_t v = 0;
      size_t digits = 0;
      while (j < s.size() && (hex ? is_hex(s[j]) : (s[j] >= '0' && s[j] <= '9'))) {
        const char c = s[j];
        const int d = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
        if (v < 0x110000) v = v * (hex ? 16 : 10) + uint64_t(d);
        ++j;
        ++digits;
      }
      if (digits > 0) {
        if (j < s.size() && s[j] == ';') ++j;
        append_numeric_reference(out, v);
        i = j;
        continue;
      }
    }
    bool done = false;
    for (const Entity& e : kEntities) {
      const size_t n = std::strlen(e.name);
      if (s.substr(i + 1, n) != e.name) continue;
      if (i + 1 + n < s.size() && s[i + 1 + n] == ';') {
        append_utf8(out, e.cp);
        i += n + 2;
        done = true;
        break;
      }
      if (e.legacy) {
        append_utf8(out, e.cp);
        i += n + 1;
        done = true;
        break;
      }
    }
    if (!done) out += s[i++];
  }
  return out;
}

// Decodes the UTF-8 sequence at s[i] (invalid bytes: one byte, code point
// 0xFFFFFFFF so they never count as whitespace). Returns its length.
size_t utf8_at(std::string_view s, size_t i, uint32_t& cp) {
  const auto b = uint8_t(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) {
    cp = 0xFFFFFFFFu;
    return 1;
  }
  cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < n; ++k) {
    const auto c = uint8_t(s[i + k]);
    if ((c >> 6) != 2) {
      cp = 0xFFFFFFFFu;
      return 1;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  return n;
}

// Python's str.isspace / re's \s for str patterns.
bool is_unicode_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace

std::string clean_prompt(std::string_view text) {
  const std::string unescaped = html_unescape(html_unescape(text));
  std::string out;
  out.reserve(unescaped.size());
  bool pending_space = false;
  for (size_t i = 0; i < unescaped.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_at(unescaped, i, cp);
    if (is_unicode_space(cp)) {
      pending_space = !out.empty();  // leading whitespace is stripped
    } else {
      if (pending_space) out += ' ';
      pending_space = false;
      out.append(unescaped, i, n);
    }
    i += n;
  }
  return out;  // trailing whitespace never emitted
}

UMT5Tokenizer::~UMT5Tokenizer() = default;
UMT5Tokenizer::UMT5Tokenizer(UMT5Tokenizer&&) noexcept = default;
UMT5Tokenizer& UMT5Tokenizer::operator=(UMT5Tokenizer&&) noexcept = default;

UMT5Tokenizer UMT5Tokenizer::load(const std::string& dir_or_model) {
  std::error_code ec;
  fs::path model = dir_or_model;
  if (fs::is_directory(model, ec)) {
    model /= "spiece.model";
    if (!fs::is_regular_file(model, ec)) {
      const bool has_json = fs::is_regular_file(fs::path(dir_or_model) / "tokenizer.json", ec);
      fail(ErrorKind::Io, "tokenizer folder ", dir_or_model, " has no spiece.model",
           has_json ? " (it has tokenizer.json, which turbodiff does not read: the umT5 tokenizer needs the "
                      "SentencePiece model spiece.model from google/umt5-xxl)"
                    : " (expected the HF google/umt5-xxl tokenizer files: spiece.model, tokenizer.json, ...)");
    }
  } else if (!fs::is_regular_file(model, ec)) {
    fail(ErrorKind::Io, "tokenizer ", dir_or_model, " does not exist (expected a folder with spiece.model or the "
         "spiece.model file)");
  }
  UMT5Tokenizer t;
  t.path_ = model.string();
  t.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = t.sp_->Load(t.path_);
  TD_CHECK(status.ok(), Format, "tokenizer ", t.path_, " is not a SentencePiece model: ", status.ToString());
  // T5's special ids: <pad> 0, </s> 1 (the ids the encoder's padding and EOS use).
  TD_CHECK(t.sp_->pad_id() == 0 && t.sp_->eos_id() == 1, Format, "tokenizer ", t.path_, ": pad id ",
           t.sp_->pad_id(), " and eos id ", t.sp_->eos_id(), ", expected T5's 0 and 1");
  return t;
}

int64_t UMT5Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::vector<int64_t> UMT5Tokenizer::encode(std::string_view cleaned) const {
  std::vector<int> pieces;
  const auto status = sp_->Encode(cleaned, &pieces);
  TD_CHECK(status.ok(), Internal, "SentencePiece (", path_, ") could not encode the prompt: ", status.ToString());
  std::vector<int64_t> ids(pieces.begin(), pieces.end());
  ids.push_back(eos_id());
  return ids;
}

TokenizedBatch UMT5Tokenizer::tokenize(const std::vector<std::string>& prompts, int64_t max_length) const {
  TD_CHECK(max_length >= 1, Usage, "tokenizer max_length must be >= 1, got ", max_length);
  const int64_t B = int64_t(prompts.size());
  TokenizedBatch out;
  out.ids = Tensor::zeros({B, max_length}, DType::I64);
  out.mask = Tensor::zeros({B, max_length}, DType::I64);
  int64_t* ip = out.ids.data<int64_t>();
  int64_t* mp = out.mask.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> ids = encode(clean_prompt(prompts[size_t(b)]));
    out.untruncated.push_back(int64_t(ids.size()));
    if (int64_t(ids.size()) > max_length) {
      log_warn("prompt ", b, " has ", ids.size(), " tokens (with </s>), more than the text encoder's ", max_length,
               ": truncated to the first ", max_length - 1, " tokens and </s>");
      ids.resize(size_t(max_length));
      ids.back() = eos_id();
    }
    for (size_t j = 0; j < ids.size(); ++j) {
      ip[b * max_length + int64_t(j)] = ids[j];
      mp[b * max_length + int64_t(j)] = 1;
    }
    for (int64_t j = int64_t(ids.size()); j < max_length; ++j) ip[b * max_length + j] = pad_id();
    out.lengths.push_back(int64_t(ids.size()));
  }
  return out;
}

Tensor zero_pad_context(const Tensor& hidden_in, const std::vector<int64_t>& lengths) {
  TD_CHECK(hidden_in.device().is_cpu() && hidden_in.dim() == 3, Shape,
           "zero_pad_context: expected a host [B, L, d] tensor, got ", shape_str(hidden_in.shape()), " on ",
           hidden_in.device().str());
  const int64_t B = hidden_in.size(0), L = hidden_in.size(1), d = hidden_in.size(2);
  TD_CHECK(int64_t(lengths.size()) == B, Shape, "zero_pad_context: ", lengths.size(), " lengths for a batch of ", B);
  Tensor out = hidden_in.contiguous().to(DType::F32).clone();
  float* p = out.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lengths[size_t(b)];
    TD_CHECK(n >= 0 && n <= L, Shape, "zero_pad_context: length ", n, " of sample ", b, " is outside [0, ", L, "]");
    std::memset(p + (b * L + n) * d, 0, size_t((L - n) * d) * sizeof(float));
  }
  return out;
}

}  // namespace td::models::umt5
