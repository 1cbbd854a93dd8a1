#include "io/pth_writer.h"
#include "io/temp_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>

namespace td::io {
namespace {

// ---- CRC-32 (zip's: reflected polynomial 0xEDB88320) ------------------------
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

uint32_t crc32(const uint8_t* p, size_t n, uint32_t crc = 0) {
  const auto& t = crc_table();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

// ---- little-endian byte buffer ---------------------------------------------
struct Bytes {
  std::vector<uint8_t> b;
  void u8(uint8_t v) { b.push_back(v); }
  void u16(uint16_t v) { for (int i = 0; i < 2; ++i) b.push_back(uint8_t(v >> (8 * i))); }
  void u32(uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i))); }
  void u64(uint64_t v) { for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i))); }
  void raw(const void* p, size_t n) { b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n); }
  void str(const std::string& s) { raw(s.data(), s.size()); }
};

// ---- pickle (protocol 2) of the state dict ----------------------------------
struct Pickler {
  Bytes out;
  void op(char c) { out.u8(uint8_t(c)); }
  void global(const std::string& module, const std::string& name) {
    op('c');
    out.str(module + "\n" + name + "\n");
  }
  void unicode(const std::string& s) {
    op('X');  // BINUNICODE
    out.u32(uint32_t(s.size()));
    out.str(s);
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');  // BININT1
      out.u8(uint8_t(v));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');  // BININT
      out.u32(uint32_t(int32_t(v)));
    } else {
      op('\x8a');  // LONG1: 8-byte two's complement
      out.u8(8);
      out.u64(uint64_t(v));
    }
  }
  void int_tuple(const std::vector<int64_t>& v) {
    if (v.empty()) {
      op(')');  // EMPTY_TUPLE
      return;
    }
    op('(');  // MARK
    for (int64_t x : v) integer(x);
    op('t');  // TUPLE
  }
  void empty_ordered_dict() {
    global("collections", "OrderedDict");
    op(')');
    op('R');  // REDUCE
  }
};

const char* storage_class(DType t) {
  switch (t) {
    case DType::F32: return "FloatStorage";
    case DType::F64: return "DoubleStorage";
    case DType::F16: return "HalfStorage";
    case DType::BF16: return "BFloat16Storage";
    case DType::I8: return "CharStorage";
    case DType::U8: return "ByteStorage";
    case DType::I16: return "ShortStorage";
    case DType::I32: return "IntStorage";
    case DType::I64: return "LongStorage";
    case DType::Bool: return "BoolStorage";
    default: return nullptr;
  }
}

// ---- the output file ----------------------------------------------------------

constexpr uint32_t kMax32 = 0xFFFFFFFFu;
// Sizes and offsets at or above this are written with ZIP64 records: 2^32 - 1,
// except in tests (detail::set_pth_zip64_threshold_for_tests).
uint64_t g_zip64_threshold = kMax32;
constexpr uint64_t kAlign = 64;  // torch aligns storages to 64 bytes (mmap-friendly)

struct Entry {
  std::string name;
  uint64_t offset = 0, size = 0;
  uint32_t crc = 0;
};

// Zip writer of stored entries (version 4.5 when ZIP64 fields are needed).
class ZipOut {
 public:
  explicit ZipOut(TempFile& f) : f_(f) {}

  void add(const std::string& name, const uint8_t* data, uint64_t size) {
    Entry e{name, f_.pos(), size, crc32(data, size_t(size))};
    const bool zip64 = size >= g_zip64_threshold;
    Bytes h;
    h.u32(0x04034b50);
    h.u16(zip64 ? 45 : 20);  // version needed
    h.u16(0);                // flags
    h.u16(0);                // stored
    h.u16(0);
    h.u16(0x21);  // DOS time/date: 1980-01-01
    h.u32(e.crc);
    h.u32(zip64 ? kMax32 : uint32_t(size));
    h.u32(zip64 ? kMax32 : uint32_t(size));
    h.u16(uint16_t(name.size()));
    // Extra: ZIP64 sizes if needed, then padding so the data starts 64-byte aligned.
    const uint64_t fixed = 30 + name.size() + (zip64 ? 20 : 0);
    uint64_t pad = (kAlign - (e.offset + fixed + 4) % kAlign) % kAlign;
    const uint16_t extra_len = uint16_t((zip64 ? 20 : 0) + 4 + pad);
    h.u16(extra_len);
    h.str(name);
    if (zip64) {
      h.u16(0x0001);
      h.u16(16);
      h.u64(size);
      h.u64(size);
    }
    h.u16(0x4246);  // "FB": a padding field, as torch.save writes
    h.u16(uint16_t(pad));
    h.b.insert(h.b.end(), size_t(pad), uint8_t('Z'));
    f_.write(h.b.data(), h.b.size());
    f_.write(data, size_t(size));
    entries_.push_back(std::move(e));
  }

  void finish() {
    const uint64_t cd_offset = f_.pos();
    Bytes cd;
    for (const Entry& e : entries_) {
      const bool big_size = e.size >= g_zip64_threshold, big_off = e.offset >= g_zip64_threshold;
      const uint16_t z64_len = uint16_t((big_size ? 16 : 0) + (big_off ? 8 : 0));
      cd.u32(0x02014b50);
      cd.u16(45);  // version made by
      cd.u16(z64_len ? 45 : 20);
      cd.u16(0);
      cd.u16(0);
      cd.u16(0);
      cd.u16(0x21);
      cd.u32(e.crc);
      cd.u32(big_size ? kMax32 : uint32_t(e.size));
      cd.u32(big_size ? kMax32 : uint32_t(e.size));
      cd.u16(uint16_t(e.name.size()));
      cd.u16(z64_len ? uint16_t(4 + z64_len) : 0);
      cd.u16(0);  // comment
      cd.u16(0);  // disk
      cd.u16(0);  // internal attributes
      cd.u32(0);  // external attributes
      cd.u32(big_off ? kMax32 : uint32_t(e.offset));
      cd.str(e.name);
      if (z64_len) {
        cd.u16(0x0001);
        cd.u16(z64_len);
        if (big_size) {
          cd.u64(e.size);
          cd.u64(e.size);
        }
        if (big_off) cd.u64(e.offset);
      }
    }
    const uint64_t cd_size = cd.b.size();
    const bool zip64 =
        cd_offset >= g_zip64_threshold || cd_size >= g_zip64_threshold || entries_.size() >= 0xFFFF;
    if (zip64) {
      const uint64_t eocd64_offset = cd_offset + cd_size;
      cd.u32(0x06064b50);  // ZIP64 end of central directory record
      cd.u64(44);
      cd.u16(45);
      cd.u16(45);
      cd.u32(0);
      cd.u32(0);
      cd.u64(entries_.size());
      cd.u64(entries_.size());
      cd.u64(cd_size);
      cd.u64(cd_offset);
      cd.u32(0x07064b50);  // its locator
      cd.u32(0);
      cd.u64(eocd64_offset);
      cd.u32(1);
    }
    cd.u32(0x06054b50);
    cd.u16(0);
    cd.u16(0);
    cd.u16(zip64 ? 0xFFFF : uint16_t(entries_.size()));
    cd.u16(zip64 ? 0xFFFF : uint16_t(entries_.size()));
    cd.u32(zip64 ? kMax32 : uint32_t(cd_size));
    cd.u32(zip64 ? kMax32 : uint32_t(cd_offset));
    cd.u16(0);
    f_.write(cd.b.data(), cd.b.size());
  }

 private:
  TempFile& f_;
  std::vector<Entry> entries_;
};

}  // namespace

namespace detail {
uint64_t set_pth_zip64_threshold_for_tests(uint64_t bytes) {
  const uint64_t old = g_zip64_threshold;
  g_zip64_threshold = std::min<uint64_t>(std::max<uint64_t>(bytes, 1), kMax32);
  return old;
}
}  // namespace detail

void write_pth(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
               const std::string& archive_name) {
  TD_CHECK(!archive_name.empty() && archive_name.find('/') == std::string::npos, Usage, "write_pth ", path,
           ": archive name '", archive_name, "' must be a non-empty name without '/'");
  std::set<std::string> names;
  std::vector<Tensor> data;
  Pickler pk;
  pk.op('\x80');  // PROTO 2
  pk.out.u8(2);
  pk.empty_ordered_dict();
  if (!tensors.empty()) pk.op('(');  // MARK for SETITEMS
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    TD_CHECK(names.insert(name).second, Usage, "write_pth ", path, ": tensor name ", name, " appears twice");
    TD_CHECK(t.defined(), Usage, "write_pth ", path, ": tensor ", name, " is undefined");
    TD_CHECK(t.device().is_cpu(), Usage, "write_pth ", path, ": tensor ", name, " is on ", t.device().str(),
             "; copy it to the host first");
    const char* storage = storage_class(t.dtype());
    TD_CHECK(storage != nullptr, DType, "write_pth ", path, ": tensor ", name, " has dtype ", dtype_name(t.dtype()),
             ", which has no torch storage type here");
    const Tensor c = t.contiguous();
    pk.unicode(name);
    pk.global("torch._utils", "_rebuild_tensor_v2");
    pk.op('(');
    pk.op('(');  // persistent id tuple
    pk.unicode("storage");
    pk.global("torch", storage);
    pk.unicode(std::to_string(i));
    pk.unicode("cpu");
    pk.integer(c.numel());
    pk.op('t');
    pk.op('Q');  // BINPERSID
    pk.integer(0);  // storage offset
    pk.int_tuple(c.shape());
    pk.int_tuple(contiguous_strides(c.shape()));
    pk.op('\x89');  // NEWFALSE: requires_grad
    pk.empty_ordered_dict();  // backward hooks
    pk.op('t');
    pk.op('R');
    data.push_back(c);
  }
  if (!tensors.empty()) pk.op('u');  // SETITEMS
  pk.op('.');                        // STOP

  TempFile f(path);
  ZipOut zip(f);
  const std::string pre = archive_name + "/";
  zip.add(pre + "data.pkl", pk.out.b.data(), pk.out.b.size());
  const std::string order = "little";
  zip.add(pre + "byteorder", reinterpret_cast<const uint8_t*>(order.data()), order.size());
  for (size_t i = 0; i < data.size(); ++i)
    zip.add(pre + "data/" + std::to_string(i), static_cast<const uint8_t*>(data[i].raw_data()), data[i].nbytes());
  const std::string version = "3\n";
  zip.add(pre + "version", reinterpret_cast<const uint8_t*>(version.data()), version.size());
  zip.finish();
  f.commit();
}

}  // namespace td::io
