#include "io/safetensors.h"
#include "io/temp_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "io/mapped_file.h"

namespace td::io {
namespace {

// ordered_json keeps the header's key order, which decides the order of
// zero-byte tensors that share an offset.
using Json = nlohmann::ordered_json;

// A name as it appears in messages: quoted, control bytes escaped (a corrupt
// header must not inject newlines or terminal escapes into the CLI's output),
// very long names cut.
std::string quote_name(std::string_view s) {
  constexpr size_t kMaxShown = 200;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  out += '\'';
  if (s.size() > kMaxShown) out += cat(" (cut, ", s.size(), " bytes)");
  return out;
}

// A JSON value as it appears in messages, cut to a readable length.
std::string snippet(const Json& v) {
  std::string s = v.dump(-1, ' ', true, Json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string all_safetensors_dtype_names() {
  std::string s;
  for (DType t : kAllDTypes) s += cat(s.empty() ? "" : ", ", dtype_safetensors_name(t));
  return s;
}

// A safetensors header or index nests 3 levels (header, entry, shape); anything
// far deeper is hostile.
constexpr int kMaxJsonDepth = 32;

// Parses JSON text, rejecting duplicate keys in any object (nlohmann keeps the
// last silently, which would hide a tensor listed twice). Throws td::Error(Format)
// prefixed with `where`.
Json parse_json_strict(const char* begin, const char* end, const std::string& where) {
  // nlohmann's lexer takes a NUL byte for the end of input, so "{}\0garbage"
  // would parse; JSON text never holds a raw NUL.
  if (const void* nul = std::memchr(begin, 0, size_t(end - begin)))
    fail(ErrorKind::Format, where, " holds a NUL byte at byte ", static_cast<const char*>(nul) - begin,
         ", expected JSON text (padded with spaces)");
  std::vector<std::unordered_set<std::string>> keys_per_open_object;
  std::optional<std::string> duplicate;
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        // Deep nesting is never valid here and would make the recursive parts of
        // nlohmann (dump, copy) overflow the stack on a hostile header.
        TD_CHECK(depth < kMaxJsonDepth, Format, where, " nests arrays/objects more than ", kMaxJsonDepth,
                 " levels deep, expected at most 3");
        if (event == Json::parse_event_t::object_start) keys_per_open_object.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys_per_open_object.empty()) keys_per_open_object.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys_per_open_object.empty() && parsed.is_string() &&
            !keys_per_open_object.back().insert(parsed.get_ref<const std::string&>()).second && !duplicate)
          duplicate = parsed.get_ref<const std::string&>();
        break;
      default:
        break;
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(begin, end, on_event, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    fail(ErrorKind::Format, where, " is not valid JSON: ", e.what());
  }
  if (duplicate) fail(ErrorKind::Format, where, ": key ", quote_name(*duplicate), " appears twice in one JSON object");
  return j;
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// One header entry after validation.
struct EntryInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t nbytes = 0;
  uint64_t begin = 0, end = 0;
};

std::string offsets_str(uint64_t b, uint64_t e) { return cat("[", b, ", ", e, "]"); }

EntryInfo parse_entry(const std::string& file, const std::string& name, const Json& v, uint64_t region_size) {
  const std::string where = cat(file, ": tensor ", quote_name(name));
  TD_CHECK(v.is_object(), Format, where, ": header entry is ", snippet(v),
           ", expected an object with \"dtype\", \"shape\" and \"data_offsets\"");
  EntryInfo e;
  e.name = name;

  const auto dt = v.find("dtype");
  TD_CHECK(dt != v.end(), Format, where, ": header entry has no \"dtype\"");
  TD_CHECK(dt->is_string(), Format, where, ": \"dtype\" is ", snippet(*dt), ", expected a string");
  const auto dtype = dtype_from_safetensors_name(dt->get_ref<const std::string&>());
  TD_CHECK(dtype.has_value(), Format, where, ": unknown dtype ", quote_name(dt->get_ref<const std::string&>()),
           " (expected one of ", all_safetensors_dtype_names(), ")");
  e.dtype = *dtype;
  const uint64_t esize = dtype_size(e.dtype);

  const auto sh = v.find("shape");
  TD_CHECK(sh != v.end(), Format, where, ": header entry has no \"shape\"");
  TD_CHECK(sh->is_array(), Format, where, ": \"shape\" is ", snippet(*sh), ", expected an array of integers");
  // numel is the product of the dims; `extent` is the product with zero dims
  // counted as 1, which bounds every stride a contiguous view computes (so a
  // shape like [0, 2^62, 2^62] is rejected too: its strides overflow).
  uint64_t extent = 1;
  bool has_zero_dim = false, overflow = false;
  for (size_t i = 0; i < sh->size(); ++i) {
    const Json& d = (*sh)[i];
    TD_CHECK(d.is_number_unsigned(), Format, where, ": shape[", i, "] is ", snippet(d),
             ", expected a non-negative integer");
    const uint64_t n = d.get<uint64_t>();
    TD_CHECK(n <= uint64_t(std::numeric_limits<int64_t>::max()), Format, where, ": shape[", i, "] is ", n,
             ", larger than the 2^63-1 a dimension can be");
    e.shape.push_back(int64_t(n));
    if (n == 0) has_zero_dim = true;
    else if (!overflow) overflow = __builtin_mul_overflow(extent, n, &extent);
  }
  overflow = overflow || extent > uint64_t(std::numeric_limits<int64_t>::max());
  uint64_t nbytes = 0;
  if (!overflow && !has_zero_dim) overflow = __builtin_mul_overflow(extent, esize, &nbytes);
  TD_CHECK(!overflow, Format, where, ": ", dtype_name(e.dtype), shape_str(e.shape),
           " holds more elements or bytes than fit in 64 bits");
  e.nbytes = nbytes;

  const auto off = v.find("data_offsets");
  TD_CHECK(off != v.end(), Format, where, ": header entry has no \"data_offsets\"");
  TD_CHECK(off->is_array() && off->size() == 2, Format, where, ": \"data_offsets\" is ", snippet(*off),
           ", expected [begin, end]");
  for (size_t i = 0; i < 2; ++i)
    TD_CHECK((*off)[i].is_number_unsigned(), Format, where, ": data_offsets[", i, "] is ", snippet((*off)[i]),
             ", expected a non-negative integer");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  TD_CHECK(e.begin <= e.end, Format, where, ": data_offsets ", offsets_str(e.begin, e.end),
           " end before they begin");
  TD_CHECK(e.end <= region_size, Format, where, ": data_offsets ", offsets_str(e.begin, e.end),
           " reach past the end of the data region, which holds ", region_size, " bytes");
  TD_CHECK(e.end - e.begin == e.nbytes, Format, where, ": data_offsets ", offsets_str(e.begin, e.end), " hold ",
           e.end - e.begin, " bytes but ", dtype_name(e.dtype), shape_str(e.shape), " needs ", e.nbytes);
  return e;
}

// The shared tail of both readers' metadata: string pairs only.
void parse_metadata(const std::string& file, const Json& v, std::map<std::string, std::string>& out) {
  if (v.is_null()) return;  // the reference writer omits it; some writers emit null
  TD_CHECK(v.is_object(), Format, file, ": \"__metadata__\" is ", snippet(v),
           ", expected an object of string values");
  for (const auto& [k, val] : v.items()) {
    TD_CHECK(val.is_string(), Format, file, ": __metadata__ key ", quote_name(k), " has value ", snippet(val),
             ", expected a string");
    out[k] = val.get<std::string>();
  }
}

Tensor make_tensor(const EntryInfo& e, const uint8_t* region, const std::shared_ptr<const void>& owner) {
  const uint8_t* p = region + e.begin;
  const size_t esize = dtype_size(e.dtype);
  std::shared_ptr<Storage> storage;
  if (e.nbytes != 0 && reinterpret_cast<uintptr_t>(p) % esize != 0) {
    // Misaligned for its element type (the header length or an offset is not a
    // multiple of it): typed loads from it would be undefined, so copy.
    storage = Storage::allocate(size_t(e.nbytes), Device::cpu());
    std::memcpy(storage->data(), p, size_t(e.nbytes));
  } else {
    storage = Storage::borrow(const_cast<uint8_t*>(p), size_t(e.nbytes), Device::cpu(), owner);
  }
  return Tensor(std::move(storage), e.dtype, e.shape, contiguous_strides(e.shape));
}

}  // namespace

TensorFile parse_safetensors(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                             const std::string& name_for_errors) {
  const std::string& file = name_for_errors;
  TD_CHECK(size >= 8, Format, file, ": file is ", size,
           " bytes, too short for the 8-byte header length of a safetensors file");
  const uint64_t header_len = read_le64(data);
  TD_CHECK(header_len <= kSafetensorsMaxHeaderBytes, Format, file, ": header length field is ", header_len,
           " bytes, more than the ", kSafetensorsMaxHeaderBytes, " allowed (corrupt or not a safetensors file)");
  TD_CHECK(header_len <= size - 8, Format, file, ": header length field is ", header_len, " bytes but only ",
           size - 8, " bytes follow it (truncated file?)");
  const char* header = reinterpret_cast<const char*>(data + 8);
  const uint8_t* region = data + 8 + header_len;
  const uint64_t region_size = size - 8 - header_len;

  TensorFile out;
  out.path = file;
  out.format = "safetensors";

  std::vector<EntryInfo> entries;
  try {
    const Json j = parse_json_strict(header, header + header_len, file + ": header");
    TD_CHECK(j.is_object(), Format, file, ": header is ", snippet(j), ", expected a JSON object");
    entries.reserve(j.size());
    for (const auto& [name, v] : j.items()) {
      if (name == "__metadata__") {
        parse_metadata(file, v, out.metadata);
        continue;
      }
      entries.push_back(parse_entry(file, name, v, region_size));
    }
  } catch (const Json::exception& e) {
    // Every access above is type-checked first; this only turns a slip into a clear error.
    fail(ErrorKind::Format, file, ": malformed header: ", e.what());
  }

  // File order is data order; stable so zero-byte tensors at one offset keep header order.
  std::stable_sort(entries.begin(), entries.end(), [](const EntryInfo& a, const EntryInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const EntryInfo* prev = nullptr;  // last tensor that holds bytes
  for (const EntryInfo& e : entries) {
    if (e.nbytes == 0) continue;
    if (prev)
      TD_CHECK(prev->end <= e.begin, Format, file, ": tensor ", quote_name(e.name), " data_offsets ",
               offsets_str(e.begin, e.end), " overlap those of tensor ", quote_name(prev->name), " ",
               offsets_str(prev->begin, prev->end));
    prev = &e;
  }

  out.tensors.reserve(entries.size());
  for (const EntryInfo& e : entries) out.tensors.emplace_back(e.name, make_tensor(e, region, owner));
  return out;
}

TensorFile read_safetensors(const std::string& path) {
  std::shared_ptr<MappedFile> m = MappedFile::open(path);
  const uint8_t* data = m->data();
  const size_t size = m->size();
  return parse_safetensors(std::move(m), data, size, path);
}

// ---- sharded checkpoints ----------------------------------------------------

TensorFile read_safetensors_sharded(const std::string& index_json_path) {
  namespace fs = std::filesystem;
  const std::string& index = index_json_path;
  std::ifstream in(index, std::ios::binary);
  TD_CHECK(in, Io, "cannot open ", index, ": ", std::strerror(errno));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TD_CHECK(!in.bad(), Io, "cannot read ", index);

  // weight_map in listing order, and the shards it names (sorted: file-name order
  // is the order of model-0000k-of-0000n shards).
  std::vector<std::pair<std::string, std::string>> weight_map;
  std::map<std::string, std::vector<std::string>> listed_per_shard;
  std::map<std::string, std::string> index_metadata;
  try {
    const Json j = parse_json_strict(text.data(), text.data() + text.size(), index);
    TD_CHECK(j.is_object(), Format, index, ": index is ", snippet(j), ", expected a JSON object");
    const auto wm = j.find("weight_map");
    TD_CHECK(wm != j.end(), Format, index, ": index has no \"weight_map\"");
    TD_CHECK(wm->is_object(), Format, index, ": \"weight_map\" is ", snippet(*wm),
             ", expected an object of tensor name -> shard file name");
    TD_CHECK(!wm->empty(), Format, index, ": \"weight_map\" lists no tensors");
    for (const auto& [name, shard_v] : wm->items()) {
      TD_CHECK(shard_v.is_string(), Format, index, ": weight_map entry for tensor ", quote_name(name), " is ",
               snippet(shard_v), ", expected a shard file name");
      const std::string& shard = shard_v.get_ref<const std::string&>();
      const fs::path sp(shard);
      bool escapes = shard.empty() || sp.is_absolute();
      for (const auto& part : sp) escapes = escapes || part == "..";
      TD_CHECK(!escapes, Format, index, ": weight_map maps tensor ", quote_name(name), " to shard ", quote_name(shard),
               ", expected a file name relative to the index's directory");
      weight_map.emplace_back(name, shard);
      listed_per_shard[shard].push_back(name);
    }
    const auto md = j.find("metadata");
    if (md != j.end() && !md->is_null()) {
      TD_CHECK(md->is_object(), Format, index, ": \"metadata\" is ", snippet(*md), ", expected an object");
      for (const auto& [k, v] : md->items()) index_metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
  } catch (const Json::exception& e) {
    fail(ErrorKind::Format, index, ": malformed index: ", e.what());
  }

  TensorFile out;
  out.path = index;
  out.format = "safetensors-sharded";
  out.metadata = index_metadata;
  std::unordered_map<std::string, std::string> shard_of;  // tensor -> shard that holds it
  for (const auto& [name, shard] : weight_map) shard_of.emplace(name, shard);
  std::unordered_map<std::string, std::string> found_in;  // tensor -> shard it was read from
  std::vector<std::string> unlisted;                      // "'name' (in shard)"
  const fs::path dir = fs::path(index).parent_path();
  // All shards must exist before any is read, so a missing one is reported as such.
  for (const auto& [shard, listed] : listed_per_shard) {
    const std::string shard_path = (dir / shard).string();
    std::error_code ec;
    TD_CHECK(fs::exists(shard_path, ec), Io, index, ": weight_map names shard ", quote_name(shard), " (for tensor ",
             quote_name(listed.front()), " and ", listed.size() - 1, " more) but ", shard_path, " does not exist");
  }
  for (const auto& [shard, listed] : listed_per_shard) {
    const std::string shard_path = (dir / shard).string();
    TensorFile sf = read_safetensors(shard_path);
    std::unordered_set<std::string> in_shard;
    for (const auto& [name, t] : sf.tensors) in_shard.insert(name);
    for (const std::string& name : listed)
      TD_CHECK(in_shard.count(name), Format, index, ": weight_map places tensor ", quote_name(name), " in shard ",
               quote_name(shard), " but ", shard_path, " does not contain it");
    for (auto& [name, t] : sf.tensors) {
      const auto seen = found_in.find(name);
      TD_CHECK(seen == found_in.end(), Format, index, ": tensor ", quote_name(name), " is in two shards, ",
               quote_name(seen->second), " and ", quote_name(shard));
      found_in.emplace(name, shard);
      const auto listed_at = shard_of.find(name);
      if (listed_at == shard_of.end()) {
        unlisted.push_back(cat(quote_name(name), " (in ", quote_name(shard), ")"));
        continue;
      }
      TD_CHECK(listed_at->second == shard, Format, index, ": tensor ", quote_name(name), " is in shard ", quote_name(shard),
               " but the weight_map places it in ", quote_name(listed_at->second));
      out.tensors.emplace_back(name, std::move(t));
    }
    for (const auto& [k, v] : sf.metadata) out.metadata.emplace(k, v);
  }
  if (!unlisted.empty()) {
    std::string names;
    for (size_t i = 0; i < unlisted.size() && i < 5; ++i) names += cat(i ? ", " : "", unlisted[i]);
    fail(ErrorKind::Format, index, ": ", unlisted.size(), " shard tensor(s) missing from the weight_map: ", names,
         unlisted.size() > 5 ? ", ..." : "");
  }
  return out;
}

// ---- writer -----------------------------------------------------------------

namespace {


void check_utf8(const std::string& s, const std::string& what) {
  try {
    (void)Json(s).dump();
  } catch (const Json::exception&) {
    fail(ErrorKind::Format, what, " ", quote_name(s), " is not valid UTF-8, which a safetensors header needs");
  }
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::unordered_set<std::string> names;
  std::vector<Tensor> contiguous;
  contiguous.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    const std::string where = cat(path, ": tensor ", quote_name(name));
    TD_CHECK(name != "__metadata__", Format, where, ": the name is reserved for the header's metadata");
    TD_CHECK(names.insert(name).second, Format, where, ": name given twice (tensor names must be unique)");
    TD_CHECK(t.defined(), Format, where, ": tensor is undefined");
    TD_CHECK(t.device().is_cpu(), Unsupported, where, ": tensor is on ", t.device().str(),
             ", expected a host tensor (copy it to the CPU first)");
    check_utf8(name, cat(path, ": tensor name"));
    contiguous.push_back(t.contiguous());
  }
  for (const auto& [k, v] : metadata) {
    check_utf8(k, cat(path, ": metadata key"));
    check_utf8(v, cat(path, ": metadata value for key ", quote_name(k), ":"));
  }

  // Largest elements first: with no gaps allowed, this keeps every tensor
  // aligned to its element size (all sizes are powers of two up to 8).
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(contiguous[a].dtype()) > dtype_size(contiguous[b].dtype());
  });

  Json header = Json::object();
  if (!metadata.empty()) {
    Json md = Json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    header["__metadata__"] = std::move(md);
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const Tensor& t = contiguous[i];
    Json entry = Json::object();
    entry["dtype"] = dtype_safetensors_name(t.dtype());
    entry["shape"] = t.shape();
    entry["data_offsets"] = {offset, offset + t.nbytes()};
    header[tensors[i].first] = std::move(entry);
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data region starts 8-byte aligned

  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  TempFile f(path);
  f.write(len_bytes, 8);
  f.write(text.data(), text.size());
  for (size_t i : order)
    if (contiguous[i].nbytes() > 0) f.write(contiguous[i].raw_data(), contiguous[i].nbytes());
  f.commit();
}

}  // namespace td::io
