// Read-only view of a zip archive held in memory (a mapped file): the central
// directory, ZIP64 included, and the bytes of stored (uncompressed) entries.
// This is what torch.save writes since PyTorch 1.6: every entry stored, data
// aligned to 64 bytes through padding in the local header's extra field, ZIP64
// records always present and ZIP64 extra fields for entries past 4 GB.
//
// Nothing is trusted: every offset and size is checked against the buffer, and
// any inconsistency is a td::Error(Format) naming the archive and the entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace td::io::zip {

struct Entry {
  std::string name;
  uint16_t method = 0;             // 0 = stored; anything else is compressed
  uint16_t flags = 0;              // general purpose bit flags (bit 0: encrypted)
  uint32_t crc32 = 0;              // as recorded in the central directory (not verified)
  uint64_t compressed_size = 0;    // bytes of the entry in the archive
  uint64_t uncompressed_size = 0;  // bytes after decompression (== compressed for stored)
  uint64_t local_header_offset = 0;
  uint64_t data_offset = 0;        // first data byte: local header + its own name and extra lengths
};

class Archive {
 public:
  // Parses the central directory of the zip in [data, data + size). The buffer
  // must outlive the Archive. `name_for_errors` is used in every message.
  static Archive parse(const uint8_t* data, size_t size, std::string name_for_errors);

  // All entries, sorted by name (names are unique: duplicates are rejected).
  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* find(std::string_view name) const;  // exact name; nullptr if absent
  // The bytes of a stored entry of this archive. A compressed or encrypted entry is a
  // td::Error(Unsupported) naming the entry and its method.
  std::span<const uint8_t> stored_bytes(const Entry& e) const;
  const std::string& name_for_errors() const { return name_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  std::vector<Entry> entries_;
};

// True when the buffer begins with a zip local file header ("PK\3\4") or is an
// empty archive ("PK\5\6").
bool looks_like_zip(const uint8_t* data, size_t size);

}  // namespace td::io::zip
