#include "io/zip.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace td::io::zip {
namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZip64EocdSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kEocdSize = 22;
constexpr size_t kZip64EocdSize = 56;
constexpr size_t kZip64LocatorSize = 20;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kLocalHeaderSize = 30;
constexpr uint16_t kZip64ExtraId = 0x0001;

uint16_t rd16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t rd32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
uint64_t rd64(const uint8_t* p) { return uint64_t(rd32(p)) | (uint64_t(rd32(p + 4)) << 32); }

// True when [offset, offset + len) lies inside [0, limit) without overflow.
bool range_ok(uint64_t offset, uint64_t len, uint64_t limit) { return offset <= limit && len <= limit - offset; }

// Where the end-of-central-directory record starts: searched backwards from
// the end (it is followed only by an archive comment of at most 65535 bytes).
size_t find_eocd(const uint8_t* data, size_t size, const std::string& name) {
  if (size < kEocdSize)
    fail(ErrorKind::Format, name, ": not a zip archive (", size, " bytes, shorter than an end-of-central-directory record)");
  const size_t last = size - kEocdSize;
  const size_t first = last > 0xffff ? last - 0xffff : 0;
  for (size_t pos = last + 1; pos-- > first;) {
    if (rd32(data + pos) != kEocdSig) continue;
    const size_t comment_len = rd16(data + pos + 20);
    if (pos + kEocdSize + comment_len <= size) return pos;
  }
  fail(ErrorKind::Format, name,
       ": no zip end-of-central-directory record in the last 64 KiB (the file is truncated or not a zip archive)");
}

struct Directory {
  uint64_t entries = 0;
  uint64_t cd_size = 0;
  uint64_t cd_offset = 0;
  uint64_t cd_limit = 0;  // the central directory must end at or before this offset
};

Directory read_directory(const uint8_t* data, size_t size, const std::string& name) {
  const size_t eocd = find_eocd(data, size, name);
  const uint8_t* e = data + eocd;
  Directory d;
  const uint16_t disk = rd16(e + 4), disk_cd = rd16(e + 6);
  const uint16_t n_disk = rd16(e + 8), n_total = rd16(e + 10);
  d.cd_size = rd32(e + 12);
  d.cd_offset = rd32(e + 16);
  d.entries = n_total;
  d.cd_limit = eocd;

  const bool has_locator = eocd >= kZip64LocatorSize && rd32(data + eocd - kZip64LocatorSize) == kZip64LocatorSig;
  if (has_locator) {
    const uint8_t* loc = data + eocd - kZip64LocatorSize;
    const uint32_t loc_disk = rd32(loc + 4);
    const uint64_t rec_off = rd64(loc + 8);
    const uint32_t total_disks = rd32(loc + 16);
    TD_CHECK(loc_disk == 0 && total_disks <= 1, Unsupported, name, ": multi-disk (split) zip archives are not supported (ZIP64 locator names disk ",
             loc_disk, " of ", total_disks, ")");
    const uint64_t loc_pos = eocd - kZip64LocatorSize;
    TD_CHECK(range_ok(rec_off, kZip64EocdSize, loc_pos), Format, name, ": ZIP64 end-of-central-directory offset ", rec_off,
             " does not leave room for its 56-byte record before the locator at ", loc_pos);
    const uint8_t* r = data + rec_off;
    TD_CHECK(rd32(r) == kZip64EocdSig, Format, name, ": no ZIP64 end-of-central-directory signature at offset ", rec_off,
             " (found 0x", std::hex, rd32(r), ")");
    const uint32_t z_disk = rd32(r + 16), z_disk_cd = rd32(r + 20);
    const uint64_t z_n_disk = rd64(r + 24), z_n_total = rd64(r + 32);
    TD_CHECK(z_disk == 0 && z_disk_cd == 0 && z_n_disk == z_n_total, Unsupported, name,
             ": multi-disk (split) zip archives are not supported (ZIP64 record: disk ", z_disk, ", directory disk ",
             z_disk_cd, ", ", z_n_disk, " of ", z_n_total, " entries on this disk)");
    d.entries = z_n_total;
    d.cd_size = rd64(r + 40);
    d.cd_offset = rd64(r + 48);
    d.cd_limit = rec_off;
  } else {
    TD_CHECK(disk == 0 && disk_cd == 0 && n_disk == n_total, Unsupported, name,
             ": multi-disk (split) zip archives are not supported (disk ", disk, ", directory disk ", disk_cd, ", ", n_disk,
             " of ", n_total, " entries on this disk)");
    TD_CHECK(n_total != 0xffff && d.cd_size != 0xffffffffu && d.cd_offset != 0xffffffffu, Format, name,
             ": the end-of-central-directory record defers to ZIP64 values but there is no ZIP64 locator before it");
  }
  TD_CHECK(range_ok(d.cd_offset, d.cd_size, d.cd_limit), Format, name, ": central directory at offset ", d.cd_offset, " of ",
           d.cd_size, " bytes runs past the end-of-directory records at ", d.cd_limit, " (file size ", size, ")");
  TD_CHECK(d.entries <= d.cd_size / kCentralHeaderSize, Format, name, ": central directory of ", d.cd_size,
           " bytes cannot hold the ", d.entries, " entries it claims (each takes at least 46 bytes)");
  return d;
}

// Replaces the 32-bit fields saturated at 0xffffffff by the values of the
// ZIP64 extended-information extra field, which lists only those, in order.
void apply_zip64_extra(Entry& ent, const uint8_t* extra, size_t extra_len, uint32_t csize32, uint32_t usize32,
                       uint32_t off32, uint16_t disk16, const std::string& name) {
  const bool need_u = usize32 == 0xffffffffu, need_c = csize32 == 0xffffffffu, need_o = off32 == 0xffffffffu;
  const bool need_d = disk16 == 0xffff;
  if (!need_u && !need_c && !need_o && !need_d) return;
  size_t p = 0;
  while (p + 4 <= extra_len) {
    const uint16_t id = rd16(extra + p);
    const uint16_t len = rd16(extra + p + 2);
    TD_CHECK(p + 4 + len <= extra_len, Format, name, ": entry '", ent.name, "': extra field 0x", std::hex, id, std::dec,
             " of ", len, " bytes runs past the entry's ", extra_len, "-byte extra area");
    if (id == kZip64ExtraId) {
      const uint8_t* f = extra + p + 4;
      size_t q = 0;
      auto take64 = [&](const char* what) {
        TD_CHECK(q + 8 <= len, Format, name, ": entry '", ent.name, "': ZIP64 extra field of ", len,
                 " bytes lacks the 64-bit ", what);
        const uint64_t v = rd64(f + q);
        q += 8;
        return v;
      };
      if (need_u) ent.uncompressed_size = take64("uncompressed size");
      if (need_c) ent.compressed_size = take64("compressed size");
      if (need_o) ent.local_header_offset = take64("local header offset");
      if (need_d) {
        TD_CHECK(q + 4 <= len, Format, name, ": entry '", ent.name, "': ZIP64 extra field lacks the disk number");
        TD_CHECK(rd32(f + q) == 0, Unsupported, name, ": entry '", ent.name, "' starts on disk ", rd32(f + q),
                 "; multi-disk archives are not supported");
      }
      return;
    }
    p += 4 + size_t(len);
  }
  fail(ErrorKind::Format, name, ": entry '", ent.name,
       "' has 32-bit size/offset fields saturated at 0xffffffff but no ZIP64 extra field");
}

}  // namespace

bool looks_like_zip(const uint8_t* data, size_t size) {
  return size >= 4 && (rd32(data) == kLocalHeaderSig || rd32(data) == kEocdSig);
}

Archive Archive::parse(const uint8_t* data, size_t size, std::string name_for_errors) {
  Archive a;
  a.data_ = data;
  a.size_ = size;
  a.name_ = std::move(name_for_errors);
  const std::string& name = a.name_;
  const Directory d = read_directory(data, size, name);

  a.entries_.reserve(size_t(d.entries));
  uint64_t p = d.cd_offset;
  const uint64_t cd_end = d.cd_offset + d.cd_size;
  for (uint64_t i = 0; i < d.entries; ++i) {
    TD_CHECK(range_ok(p, kCentralHeaderSize, cd_end), Format, name, ": central directory entry ", i, " of ", d.entries,
             " at offset ", p, " runs past the directory's end at ", cd_end);
    const uint8_t* h = data + p;
    TD_CHECK(rd32(h) == kCentralHeaderSig, Format, name, ": central directory entry ", i, " at offset ", p,
             " has signature 0x", std::hex, rd32(h), " (expected 0x", kCentralHeaderSig, ")");
    Entry ent;
    ent.flags = rd16(h + 8);
    ent.method = rd16(h + 10);
    ent.crc32 = rd32(h + 16);
    const uint32_t csize32 = rd32(h + 20), usize32 = rd32(h + 24);
    const uint16_t name_len = rd16(h + 28), extra_len = rd16(h + 30), comment_len = rd16(h + 32);
    const uint16_t disk16 = rd16(h + 34);
    const uint32_t off32 = rd32(h + 42);
    const uint64_t var_len = uint64_t(name_len) + extra_len + comment_len;
    TD_CHECK(range_ok(p + kCentralHeaderSize, var_len, cd_end), Format, name, ": central directory entry ", i,
             " with a ", name_len, "-byte name, ", extra_len, "-byte extra and ", comment_len,
             "-byte comment runs past the directory's end at ", cd_end);
    ent.name.assign(reinterpret_cast<const char*>(h + kCentralHeaderSize), name_len);
    TD_CHECK(!ent.name.empty(), Format, name, ": central directory entry ", i, " has an empty name");
    ent.compressed_size = csize32;
    ent.uncompressed_size = usize32;
    ent.local_header_offset = off32;
    apply_zip64_extra(ent, h + kCentralHeaderSize + name_len, extra_len, csize32, usize32, off32, disk16, name);
    if (disk16 != 0xffff)
      TD_CHECK(disk16 == 0, Unsupported, name, ": entry '", ent.name, "' starts on disk ", disk16,
               "; multi-disk archives are not supported");

    // The data starts after the local header's own name and extra field, whose
    // lengths may differ from the central copy (torch pads the local extra to align data).
    const uint64_t lh = ent.local_header_offset;
    TD_CHECK(range_ok(lh, kLocalHeaderSize, d.cd_offset), Format, name, ": entry '", ent.name, "': local header offset ",
             lh, " does not leave room for a 30-byte header before the central directory at ", d.cd_offset);
    const uint8_t* l = data + lh;
    TD_CHECK(rd32(l) == kLocalHeaderSig, Format, name, ": entry '", ent.name, "': no local header signature at offset ",
             lh, " (found 0x", std::hex, rd32(l), ")");
    const uint16_t l_name_len = rd16(l + 26), l_extra_len = rd16(l + 28);
    TD_CHECK(range_ok(lh + kLocalHeaderSize, uint64_t(l_name_len) + l_extra_len, d.cd_offset), Format, name, ": entry '",
             ent.name, "': local header name and extra (", l_name_len, " + ", l_extra_len,
             " bytes) run into the central directory");
    TD_CHECK(l_name_len == name_len && std::equal(ent.name.begin(), ent.name.end(), l + kLocalHeaderSize), Format, name,
             ": entry '", ent.name, "': the local header at offset ", lh, " names '",
             std::string(reinterpret_cast<const char*>(l + kLocalHeaderSize), l_name_len),
             "' (central directory and local header disagree)");
    ent.data_offset = lh + kLocalHeaderSize + l_name_len + l_extra_len;
    TD_CHECK(range_ok(ent.data_offset, ent.compressed_size, d.cd_offset), Format, name, ": entry '", ent.name, "' of ",
             ent.compressed_size, " bytes at offset ", ent.data_offset, " runs past the start of the central directory at ",
             d.cd_offset, " (file size ", size, "; truncated?)");
    a.entries_.push_back(std::move(ent));
    p += kCentralHeaderSize + var_len;
  }

  // Duplicate names would make lookups ambiguous: a hostile archive could
  // show one entry to a checker and another to the loader.
  std::vector<size_t> order(a.entries_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return a.entries_[x].name < a.entries_[y].name; });
  for (size_t k = 1; k < order.size(); ++k)
    TD_CHECK(a.entries_[order[k]].name != a.entries_[order[k - 1]].name, Format, name, ": entry name '",
             a.entries_[order[k]].name, "' appears twice in the central directory");
  std::vector<Entry> sorted;
  sorted.reserve(order.size());
  for (size_t k : order) sorted.push_back(std::move(a.entries_[k]));
  a.entries_ = std::move(sorted);
  return a;
}

const Entry* Archive::find(std::string_view name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const Entry& e, std::string_view n) { return std::string_view(e.name) < n; });
  return it != entries_.end() && it->name == name ? &*it : nullptr;
}

std::span<const uint8_t> Archive::stored_bytes(const Entry& e) const {
  TD_CHECK(!(e.flags & 1), Unsupported, name_, ": entry '", e.name, "' is encrypted");
  TD_CHECK(e.method == 0, Unsupported, name_, ": entry '", e.name, "' is compressed (zip method ", e.method,
           "); only stored entries can be read in place. torch.save never compresses; re-save the file with torch.save "
           "instead of re-zipping it");
  TD_CHECK(e.compressed_size == e.uncompressed_size, Format, name_, ": stored entry '", e.name, "' has compressed size ",
           e.compressed_size, " but uncompressed size ", e.uncompressed_size);
  return {data_ + e.data_offset, size_t(e.compressed_size)};
}

}  // namespace td::io::zip
