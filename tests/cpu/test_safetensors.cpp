// safetensors reader/writer: round trips of every dtype, metadata, sharded
// indexes, interoperability with the Python `safetensors` library, and every
// way a file can be malformed (each must be a td::Error naming the problem,
// never a crash).
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "harness/harness.h"
#include "io/safetensors.h"

namespace td {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// A fresh directory for the current test inside the process's temp dir.
std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = test::temp_dir() + "/st_" + info->test_suite_name() + "_" + info->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

Bytes slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void spit(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), std::streamsize(n));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}
void spit(const std::string& path, const std::string& s) { spit(path, s.data(), s.size()); }

// Host tensor with random bytes. Bool gets 0/1 only (other bytes are not bools).
Tensor random_bytes_tensor(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  auto& g = test::rng();
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = dtype == DType::Bool ? uint8_t(g() & 1) : uint8_t(g());
  return t;
}

// Byte-exact comparison (NaN payloads included) of dtype, shape and contents.
void expect_same_tensor(const Tensor& got, const Tensor& want, const std::string& name) {
  ASSERT_TRUE(got.defined()) << name;
  EXPECT_EQ(got.dtype(), want.dtype()) << name;
  ASSERT_EQ(got.shape(), want.shape()) << name << ": " << got.desc() << " vs " << want.desc();
  const Tensor a = got.contiguous(), b = want.contiguous();
  ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
  if (a.nbytes() > 0) {
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << name << " bytes differ";
  }
}

// Builds a safetensors image from header text and a data region (no padding added).
Bytes make_image(const std::string& header, const Bytes& region) {
  Bytes out(8 + header.size() + region.size());
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(n >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(region.begin(), region.end(), out.begin() + 8 + ptrdiff_t(n));
  return out;
}

io::TensorFile parse_bytes(const Bytes& bytes, const std::string& name = "test.safetensors") {
  // An exact-size heap copy so a read past the end is a sanitizer error, not luck.
  std::shared_ptr<uint8_t[]> copy(new uint8_t[std::max<size_t>(bytes.size(), 1)]);
  if (!bytes.empty()) std::memcpy(copy.get(), bytes.data(), bytes.size());
  return io::parse_safetensors(copy, copy.get(), bytes.size(), name);
}

// Expects parsing to fail with td::Error(Format) whose message holds every fragment.
void expect_parse_error(const Bytes& bytes, const std::vector<std::string>& fragments) {
  try {
    parse_bytes(bytes);
    ADD_FAILURE() << "parsed without error; expected a message with '" << fragments.front() << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Format) << e.what();
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test.safetensors"), std::string::npos) << "message does not name the file: " << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const Shape kAwkwardShapes[] = {{}, {0}, {1}, {7}, {3, 0, 5}, {3, 5, 2}, {1, 13}, {2, 1, 3, 1}};

// ---- round trips ------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDTypeAndAwkwardShape) {
  const std::string path = test_dir() + "/all.safetensors";
  NamedTensors written;
  for (DType dt : kAllDTypes)
    for (size_t s = 0; s < std::size(kAwkwardShapes); ++s)
      written.emplace_back(cat("t.", dtype_name(dt), ".", s), random_bytes_tensor(kAwkwardShapes[s], dt));
  // Shuffle so the writer sees mixed element sizes in arbitrary order.
  std::shuffle(written.begin(), written.end(), test::rng());
  io::write_safetensors(path, written);

  const Bytes raw = slurp(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | raw[size_t(i)];
  EXPECT_EQ(header_len % 8, 0u) << "header must be padded so the data region is 8-byte aligned";

  const io::TensorFile f = io::read_safetensors(path);
  EXPECT_EQ(f.format, "safetensors");
  EXPECT_EQ(f.path, path);
  EXPECT_TRUE(f.metadata.empty());
  ASSERT_EQ(f.tensors.size(), written.size());
  for (const auto& [name, t] : written) {
    const Tensor* got = f.find(name);
    ASSERT_NE(got, nullptr) << name;
    expect_same_tensor(*got, t, name);
    EXPECT_TRUE(got->is_contiguous()) << name;
  }
  // File order is data order, and every tensor is aligned to its element size.
  const uint8_t* last_end = nullptr;
  for (const auto& [name, t] : f.tensors) {
    const auto* p = static_cast<const uint8_t*>(t.raw_data());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % dtype_size(t.dtype()), 0u) << name << " misaligned";
    if (t.nbytes() == 0) continue;
    if (last_end) {
      EXPECT_EQ(p, last_end) << name << ": data must follow the previous tensor without a gap";
    }
    last_end = p + t.nbytes();
  }
}

TEST(Safetensors, ReadViewsTheMappingWithoutCopying) {
  const std::string path = test_dir() + "/view.safetensors";
  const Tensor a = test::randn_tensor({5, 3}, DType::F32);
  io::write_safetensors(path, {{"a", a}});
  Tensor got;
  {
    io::TensorFile f = io::read_safetensors(path);
    got = f.tensors.at(0).second;
  }
  // The TensorFile is gone; the tensor still keeps the mapping alive.
  fs::remove(path);
  expect_same_tensor(got, a, "a");
  EXPECT_EQ(got.storage()->nbytes(), a.nbytes()) << "each tensor's storage must cover exactly its bytes";
}

TEST(Safetensors, MetadataRoundTrip) {
  const std::string path = test_dir() + "/meta.safetensors";
  const std::map<std::string, std::string> md = {
      {"format", "pt"}, {"empty", ""}, {"unicode ключ", "значение ✓"}, {"quote\"and\\slash", "line\nbreak"}};
  io::write_safetensors(path, {{"w", test::randn_tensor({4}, DType::BF16)}}, md);
  const io::TensorFile f = io::read_safetensors(path);
  EXPECT_EQ(f.metadata, md);
  // Metadata alone, no tensors, is a valid file too.
  io::write_safetensors(path, {}, md);
  const io::TensorFile g = io::read_safetensors(path);
  EXPECT_TRUE(g.tensors.empty());
  EXPECT_EQ(g.metadata, md);
}

TEST(Safetensors, NonContiguousInputIsWrittenContiguous) {
  const std::string path = test_dir() + "/strided.safetensors";
  const Tensor base = test::randn_tensor({6, 5, 3}, DType::F32);
  const Tensor permuted = base.permute({2, 0, 1});           // [3, 6, 5]
  const Tensor sliced = base.slice(1, 1, 4).select(2, 2);    // [6, 3], strided
  const Tensor half = test::randn_tensor({9, 7}, DType::F16).slice(0, 2, 9).permute({1, 0});
  ASSERT_FALSE(permuted.is_contiguous());
  ASSERT_FALSE(sliced.is_contiguous());
  ASSERT_FALSE(half.is_contiguous());
  io::write_safetensors(path, {{"permuted", permuted}, {"sliced", sliced}, {"half", half}});
  const io::TensorFile f = io::read_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 3u);
  expect_same_tensor(*f.find("permuted"), permuted.contiguous(), "permuted");
  expect_same_tensor(*f.find("sliced"), sliced.contiguous(), "sliced");
  expect_same_tensor(*f.find("half"), half.contiguous(), "half");
  // Spot-check against the strided source element by element, not only via contiguous().
  const Tensor& p = *f.find("permuted");
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 5; ++j)
        ASSERT_EQ(p.item_f64((c * 6 + i) * 5 + j), base.item_f64((i * 5 + j) * 3 + c));
}

TEST(Safetensors, OverwritesAtomicallyAndLeavesNoTemporaryFiles) {
  const std::string dir = test_dir();
  const std::string path = dir + "/model.safetensors";
  io::write_safetensors(path, {{"a", test::randn_tensor({3}, DType::F32)}});
  const Tensor b = test::randn_tensor({2, 2}, DType::F64);
  io::write_safetensors(path, {{"b", b}});
  const io::TensorFile f = io::read_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 1u);
  expect_same_tensor(*f.find("b"), b, "b");
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "model.safetensors");
  }
  EXPECT_EQ(files, 1u);
}

TEST(Safetensors, MisalignedTensorIsCopiedAligned) {
  // A header length that is not a multiple of 8 (other writers do this) puts an
  // f32 tensor at an odd address; the reader must still hand out aligned data.
  const std::vector<float> vals = test::randn(6);
  Bytes region(24);
  std::memcpy(region.data(), vals.data(), 24);
  for (const std::string pad : {"", " ", "  ", "   "}) {
    const Bytes img = make_image(R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})" + pad, region);
    const io::TensorFile f = parse_bytes(img);
    const Tensor& t = f.tensors.at(0).second;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 4, 0u) << "pad " << pad.size();
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(float(t.item_f64(i)), vals[size_t(i)]) << "pad " << pad.size();
  }
}

// ---- sharded checkpoints ----------------------------------------------------

struct ShardSet {
  std::string dir, index;
  NamedTensors shard1, shard2;
};

ShardSet write_shards(const std::string& dir) {
  ShardSet s;
  s.dir = dir;
  s.shard1 = {{"blocks.0.attn.q.weight", test::randn_tensor({8, 8}, DType::BF16)},
              {"blocks.0.attn.q.bias", test::randn_tensor({8}, DType::F32)},
              {"patch_embedding.weight", test::randn_tensor({8, 4, 1, 2, 2}, DType::BF16)}};
  s.shard2 = {{"blocks.1.ffn.0.weight", test::randn_tensor({16, 8}, DType::BF16)},
              {"blocks.1.ffn.0.scale", test::randn_tensor({1, 1}, DType::F32)},
              {"head.int8", random_bytes_tensor({3, 5}, DType::I8)}};
  io::write_safetensors(dir + "/model-00001-of-00002.safetensors", s.shard1, {{"format", "pt"}});
  io::write_safetensors(dir + "/model-00002-of-00002.safetensors", s.shard2, {{"format", "pt"}});
  nlohmann::ordered_json idx;
  idx["metadata"]["total_size"] = 12345;
  for (const auto& [n, t] : s.shard2) idx["weight_map"][n] = "model-00002-of-00002.safetensors";
  for (const auto& [n, t] : s.shard1) idx["weight_map"][n] = "model-00001-of-00002.safetensors";
  s.index = dir + "/diffusion_pytorch_model.safetensors.index.json";
  spit(s.index, idx.dump(2));
  return s;
}

nlohmann::json read_json(const std::string& path) {
  const Bytes b = slurp(path);
  return nlohmann::json::parse(b.begin(), b.end());
}

TEST(Safetensors, ShardedIndexReadsAllShards) {
  const ShardSet s = write_shards(test_dir());
  const io::TensorFile f = io::read_safetensors_sharded(s.index);
  EXPECT_EQ(f.format, "safetensors-sharded");
  EXPECT_EQ(f.path, s.index);
  ASSERT_EQ(f.tensors.size(), s.shard1.size() + s.shard2.size());
  for (const auto* set : {&s.shard1, &s.shard2})
    for (const auto& [n, t] : *set) {
      ASSERT_NE(f.find(n), nullptr) << n;
      expect_same_tensor(*f.find(n), t, n);
    }
  // Shard order: every tensor of shard 1 before any of shard 2.
  for (size_t i = 0; i < s.shard1.size(); ++i)
    EXPECT_TRUE(std::any_of(s.shard1.begin(), s.shard1.end(), [&](auto& p) { return p.first == f.tensors[i].first; }))
        << f.tensors[i].first;
  EXPECT_EQ(f.metadata.at("total_size"), "12345");
  EXPECT_EQ(f.metadata.at("format"), "pt");
}

TEST(Safetensors, ShardedIndexErrors) {
  const ShardSet s = write_shards(test_dir());
  const nlohmann::json good = read_json(s.index);
  const std::string bad_index = s.dir + "/bad.safetensors.index.json";
  auto error_with = [&](const nlohmann::json& idx) {
    spit(bad_index, idx.dump());
    return error_of([&] { io::read_safetensors_sharded(bad_index); });
  };
  auto expect_has = [](const std::string& msg, const std::vector<std::string>& frags) {
    for (const auto& f : frags) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  };

  {  // a shard that does not exist
    nlohmann::json idx = good;
    idx["weight_map"]["head.int8"] = "model-00003-of-00002.safetensors";
    expect_has(error_with(idx), {bad_index, "model-00003-of-00002.safetensors", "does not exist"});
  }
  {  // a listed tensor its shard lacks
    nlohmann::json idx = good;
    idx["weight_map"]["blocks.9.missing"] = "model-00001-of-00002.safetensors";
    expect_has(error_with(idx), {bad_index, "'blocks.9.missing'", "model-00001-of-00002.safetensors",
                                 "does not contain it"});
  }
  {  // a shard tensor the weight map does not list
    nlohmann::json idx = good;
    idx["weight_map"].erase("blocks.1.ffn.0.scale");
    expect_has(error_with(idx), {bad_index, "missing from the weight_map", "'blocks.1.ffn.0.scale'",
                                 "model-00002-of-00002.safetensors"});
  }
  {  // a tensor listed under the wrong shard
    nlohmann::json idx = good;
    idx["weight_map"]["head.int8"] = "model-00001-of-00002.safetensors";
    expect_has(error_with(idx), {"'head.int8'", "model-00001-of-00002.safetensors", "does not contain it"});
  }
  {  // the same tensor in two shards
    NamedTensors dup = s.shard2;
    dup.emplace_back("blocks.0.attn.q.bias", test::randn_tensor({8}, DType::F32));
    io::write_safetensors(s.dir + "/model-00002-of-00002.safetensors", dup);
    expect_has(error_with(good), {"'blocks.0.attn.q.bias'", "two shards", "model-00001-of-00002.safetensors",
                                  "model-00002-of-00002.safetensors"});
    io::write_safetensors(s.dir + "/model-00002-of-00002.safetensors", s.shard2);
  }
  {  // a shard path that leaves the index's directory
    nlohmann::json idx = good;
    idx["weight_map"]["head.int8"] = "../elsewhere.safetensors";
    expect_has(error_with(idx), {"'../elsewhere.safetensors'", "relative to the index's directory"});
  }
  expect_has(error_with(nlohmann::json::object()), {bad_index, "no \"weight_map\""});
  expect_has(error_with({{"weight_map", {{"a", 3}}}}), {"'a'", "expected a shard file name"});
  spit(bad_index, std::string("{\"weight_map\": {}}\0garbage", 26));
  expect_has(error_of([&] { io::read_safetensors_sharded(bad_index); }), {bad_index, "NUL byte at byte 18"});
  spit(bad_index, "{\"weight_map\": {");
  expect_has(error_of([&] { io::read_safetensors_sharded(bad_index); }), {bad_index, "not valid JSON"});
  expect_has(error_of([&] { io::read_safetensors_sharded(s.dir + "/nope.index.json"); }),
             {"nope.index.json", "cannot open"});
  // The good index still reads after all that.
  EXPECT_EQ(io::read_safetensors_sharded(s.index).tensors.size(), 6u);
}

// ---- malformed files --------------------------------------------------------

TEST(Safetensors, TruncatedAtEveryByteIsAnError) {
  const std::string dir = test_dir();
  const std::string path = dir + "/small.safetensors";
  io::write_safetensors(path,
                        {{"a", test::randn_tensor({2, 3}, DType::F32)},
                         {"b", random_bytes_tensor({5}, DType::I8)},
                         {"c", test::randn_tensor({3}, DType::BF16)}},
                        {{"k", "v"}});
  const Bytes full = slurp(path);
  ASSERT_NO_THROW(parse_bytes(full));
  for (size_t n = 0; n < full.size(); ++n) {
    const Bytes cut(full.begin(), full.begin() + ptrdiff_t(n));
    EXPECT_THROW(parse_bytes(cut), Error) << "truncated to " << n << " of " << full.size() << " bytes";
  }
  // And through the file path (mmap), including an empty file.
  for (size_t n : {size_t(0), size_t(7), size_t(8), full.size() / 2, full.size() - 1}) {
    const std::string cut_path = dir + "/cut.safetensors";
    spit(cut_path, full.data(), n);
    const std::string msg = error_of([&] { io::read_safetensors(cut_path); });
    EXPECT_NE(msg.find(cut_path), std::string::npos) << "cut to " << n << ": " << msg;
  }
}

TEST(Safetensors, HeaderLengthErrors) {
  Bytes img = make_image("{}", {});
  img[0] = 200;  // 200-byte header in a 10-byte file
  expect_parse_error(img, {"header length field is 200 bytes but only 2 bytes follow"});
  Bytes huge(16, 0xff);  // 2^64-1
  expect_parse_error(huge, {"header length field is 18446744073709551615", "more than the 100000000"});
  Bytes capped = make_image("{}", {});
  capped[0] = 0x01, capped[1] = 0xe1, capped[2] = 0xf5, capped[3] = 0x05;  // 100000001
  expect_parse_error(capped, {"100000001", "more than the 100000000"});
  expect_parse_error(Bytes{1, 2, 3}, {"3 bytes, too short"});
  // An empty header object is a valid file with no tensors.
  EXPECT_TRUE(parse_bytes(make_image("{}", {})).tensors.empty());
  EXPECT_TRUE(parse_bytes(make_image("  {}      ", {})).tensors.empty());
}

TEST(Safetensors, BadJsonAndBadStructure) {
  expect_parse_error(make_image("{\"a\": ", {}), {"not valid JSON"});
  expect_parse_error(make_image("", {}), {"not valid JSON"});
  expect_parse_error(make_image(std::string("{}\0\0\0\0", 6), {}), {"header holds a NUL byte at byte 2"});
  expect_parse_error(make_image("{\"a\":\"\xff\"}", {}), {"not valid JSON"});  // invalid UTF-8
  expect_parse_error(make_image("[1, 2]", {}), {"header is [1,2], expected a JSON object"});
  expect_parse_error(make_image(R"({"w": 5})", {}), {"tensor 'w'", "header entry is 5, expected an object"});
  expect_parse_error(make_image(R"({"w": {"shape": [1], "data_offsets": [0, 1]}})", Bytes(1)),
                     {"tensor 'w'", "no \"dtype\""});
  expect_parse_error(make_image(R"({"w": {"dtype": "U8", "data_offsets": [0, 1]}})", Bytes(1)),
                     {"tensor 'w'", "no \"shape\""});
  expect_parse_error(make_image(R"({"w": {"dtype": "U8", "shape": [1]}})", Bytes(1)),
                     {"tensor 'w'", "no \"data_offsets\""});
  expect_parse_error(make_image(R"({"w": {"dtype": 3, "shape": [1], "data_offsets": [0, 1]}})", Bytes(1)),
                     {"tensor 'w'", "\"dtype\" is 3, expected a string"});
  expect_parse_error(
      make_image(R"({"w": {"dtype":"U8","shape":[1],"data_offsets":[0,1]}, "w": {"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                 Bytes(1)),
      {"key 'w' appears twice"});
  expect_parse_error(make_image(R"({"__metadata__": {"k": 1}})", {}), {"__metadata__ key 'k'", "expected a string"});
  expect_parse_error(make_image(R"({"__metadata__": [1]})", {}), {"\"__metadata__\" is [1]"});
  // Deep nesting is refused before anything recursive walks it.
  const std::string deep = R"({"w": {"dtype": "U8", "data_offsets": [0, 0], "shape": )" + std::string(1'000'000, '[') +
                           std::string(1'000'000, ']') + "}}";
  expect_parse_error(make_image(deep, {}), {"more than 32 levels deep"});
  // Control bytes in a name are escaped in the message.
  expect_parse_error(make_image("{\"a\\nb\": 1}", {}), {"tensor 'a\\x0ab'"});
}

TEST(Safetensors, UnknownDType) {
  expect_parse_error(make_image(R"({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", Bytes(4)),
                     {"tensor 'w'", "unknown dtype 'F33'", "F8_E4M3"});
}

TEST(Safetensors, BadShapes) {
  const Bytes region(8);
  expect_parse_error(make_image(R"({"w": {"dtype": "U8", "shape": [2, -4], "data_offsets": [0, 8]}})", region),
                     {"tensor 'w'", "shape[1] is -4, expected a non-negative integer"});
  expect_parse_error(make_image(R"({"w": {"dtype": "U8", "shape": [2.0, 4], "data_offsets": [0, 8]}})", region),
                     {"tensor 'w'", "shape[0] is 2.0, expected a non-negative integer"});
  expect_parse_error(make_image(R"({"w": {"dtype": "U8", "shape": ["8"], "data_offsets": [0, 8]}})", region),
                     {"shape[0] is \"8\""});
  expect_parse_error(make_image(R"({"w": {"dtype": "U8", "shape": 8, "data_offsets": [0, 8]}})", region),
                     {"\"shape\" is 8, expected an array"});
  expect_parse_error(
      make_image(R"({"w": {"dtype": "U8", "shape": [9223372036854775808], "data_offsets": [0, 8]}})", region),
      {"shape[0] is 9223372036854775808", "larger than"});
}

TEST(Safetensors, ShapeWhoseByteSizeOverflows) {
  const Bytes region(8);
  // 2^32 * 2^32 elements: the element count itself overflows.
  expect_parse_error(
      make_image(R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", region),
      {"tensor 'w'", "more elements or bytes than fit in 64 bits"});
  // 2^62 elements fit, 2^62 * 8 bytes do not.
  expect_parse_error(
      make_image(R"({"w": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", region),
      {"tensor 'w'", "f64[4611686018427387904]", "more elements or bytes than fit in 64 bits"});
  // A zero dim makes it empty, but contiguous strides of the rest would still overflow.
  expect_parse_error(
      make_image(R"({"w": {"dtype": "U8", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}})", region),
      {"tensor 'w'", "more elements or bytes than fit in 64 bits"});
  // Just inside the limit with a zero dim: valid and empty.
  const io::TensorFile f = parse_bytes(
      make_image(R"({"w": {"dtype": "U8", "shape": [0, 4294967296, 2147483647], "data_offsets": [8, 8]}})", region));
  EXPECT_EQ(f.tensors.at(0).second.numel(), 0);
}

TEST(Safetensors, SizeMismatchMessageNamesEverything) {
  // The exact wording users see.
  const std::string msg = error_of([] {
    parse_bytes(make_image(R"({"blocks.0.ffn.0.weight": {"dtype": "BF16", "shape": [8, 10], "data_offsets": [0, 100]}})",
                           Bytes(100)),
                "model.safetensors");
  });
  EXPECT_EQ(msg,
            "model.safetensors: tensor 'blocks.0.ffn.0.weight': data_offsets [0, 100] hold 100 bytes but bf16[8, 10] "
            "needs 160");
  expect_parse_error(make_image(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", Bytes(16)),
                     {"data_offsets [0, 16] hold 16 bytes but f32[3] needs 12"});
  // 0-d scalars hold one element.
  expect_parse_error(make_image(R"({"w": {"dtype": "F32", "shape": [], "data_offsets": [0, 0]}})", Bytes(4)),
                     {"hold 0 bytes but f32[] needs 4"});
}

TEST(Safetensors, BadOffsets) {
  const Bytes region(16);
  expect_parse_error(make_image(R"({"w": {"dtype": "U8", "shape": [8], "data_offsets": [12, 20]}})", region),
                     {"tensor 'w'", "data_offsets [12, 20] reach past the end of the data region, which holds 16"});
  expect_parse_error(
      make_image(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [18446744073709551615, 18446744073709551615]}})",
                 region),
      {"tensor 'w'", "reach past the end"});
  expect_parse_error(make_image(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [8, 4]}})", region),
                     {"tensor 'w'", "data_offsets [8, 4] end before they begin"});
  expect_parse_error(make_image(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4, 8]}})", region),
                     {"tensor 'w'", "expected [begin, end]"});
  expect_parse_error(make_image(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [-4, 0]}})", region),
                     {"tensor 'w'", "data_offsets[0] is -4"});
  expect_parse_error(make_image(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4.0]}})", region),
                     {"tensor 'w'", "data_offsets[1] is 4.0"});
}

TEST(Safetensors, OverlappingRanges) {
  const Bytes region(16);
  expect_parse_error(make_image(R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                                    "b": {"dtype": "I16", "shape": [2], "data_offsets": [6, 10]}})",
                                region),
                     {"tensor 'b' data_offsets [6, 10] overlap those of tensor 'a' [0, 8]"});
  // Same range twice, listed in reverse order of offsets.
  expect_parse_error(make_image(R"({"z": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]},
                                    "y": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})",
                                region),
                     {"overlap"});
  // Adjacent, a gap, and a zero-byte tensor inside another's range are all fine.
  const io::TensorFile f = parse_bytes(make_image(R"({"b": {"dtype": "U8", "shape": [4], "data_offsets": [12, 16]},
                                                      "a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                                                      "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [4, 4]},
                                                      "c": {"dtype": "U8", "shape": [2], "data_offsets": [8, 10]}})",
                                                  region));
  ASSERT_EQ(f.tensors.size(), 4u);
  // In data-offset order.
  EXPECT_EQ(f.tensors[0].first, "a");
  EXPECT_EQ(f.tensors[1].first, "e");
  EXPECT_EQ(f.tensors[2].first, "c");
  EXPECT_EQ(f.tensors[3].first, "b");
}

// ---- the writer's own errors --------------------------------------------------

TEST(Safetensors, WriterRejectsBadInputAndWritesNothing) {
  const std::string dir = test_dir();
  const std::string path = dir + "/out.safetensors";
  const Tensor t = test::randn_tensor({2}, DType::F32);
  std::string msg = error_of([&] { io::write_safetensors(path, {{"x", t}, {"y", t}, {"x", t}}); });
  EXPECT_NE(msg.find("tensor 'x'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("twice"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  msg = error_of([&] { io::write_safetensors(path, {{"__metadata__", t}}); });
  EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
  msg = error_of([&] { io::write_safetensors(path, {{"u", Tensor()}}); });
  EXPECT_NE(msg.find("undefined"), std::string::npos) << msg;
  msg = error_of([&] { io::write_safetensors(path, {{"bad\xff", t}}); });
  EXPECT_NE(msg.find("not valid UTF-8"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_empty(dir)) << "a failed write left a file behind";
  msg = error_of([&] { io::write_safetensors(dir + "/no/such/dir/out.safetensors", {{"x", t}}); });
  EXPECT_NE(msg.find("no/such/dir/out.safetensors"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_empty(dir));
}

// ---- interoperability with the Python safetensors library -------------------

bool python_safetensors_available(std::string* why) {
  const int rc = std::system("python3 -c 'import safetensors.torch, torch' >/dev/null 2>&1");
  if (rc != 0) *why = "python3 with the safetensors and torch packages is not importable";
  return rc == 0;
}

TEST(Safetensors, InteroperatesWithPythonSafetensors) {
  std::string why;
  if (!python_safetensors_available(&why)) GTEST_SKIP() << why;
  const std::string dir = test_dir();
  // Our file, with dtypes Python supports and awkward shapes.
  NamedTensors ours;
  const DType dtypes[] = {DType::F64, DType::F32,  DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2,
                          DType::I64, DType::I32, DType::I16, DType::I8,   DType::U8,     DType::Bool};
  for (DType dt : dtypes) {
    const Shape shape = kAwkwardShapes[size_t(test::rng()() % std::size(kAwkwardShapes))];
    ours.emplace_back(cat("ours.", dtype_name(dt)),
                      dtype_is_floating(dt) ? test::randn_tensor(shape, dt, 3.f) : random_bytes_tensor(shape, dt));
  }
  ours.emplace_back("ours.scalar", test::randn_tensor({}, DType::F32));
  ours.emplace_back("ours.empty", test::randn_tensor({4, 0}, DType::BF16));
  const std::map<std::string, std::string> md = {{"format", "pt"}, {"note", "written by turbodiff ✓"}};
  io::write_safetensors(dir + "/ours.safetensors", ours, md);

  // Python loads our file (checking the metadata), adds tensors of its own with
  // values we can predict, and saves everything with its own writer.
  const std::string script = R"PY(
import sys, torch
from safetensors import safe_open
from safetensors.torch import save_file
d = sys.argv[1]
with safe_open(d + "/ours.safetensors", framework="pt") as f:
    md = f.metadata()
    assert md == {"format": "pt", "note": "written by turbodiff \u2713"}, md
    tensors = {k: f.get_tensor(k) for k in f.keys()}
tensors["py.arange"] = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
tensors["py.bf16_thirds"] = (torch.arange(10, dtype=torch.float32) / 3).to(torch.bfloat16)
tensors["py.i64"] = torch.tensor([-(2**62), -1, 0, 2**40 + 7], dtype=torch.int64)
tensors["py.bool"] = torch.tensor([[True, False, True]])
tensors["py.scalar"] = torch.tensor(2.5, dtype=torch.float16)
save_file(tensors, d + "/python.safetensors", metadata={"made_by": "python", "n": str(len(tensors))})
)PY";
  spit(dir + "/make.py", script);
  const std::string cmd = "python3 " + dir + "/make.py " + dir + " >" + dir + "/py.log 2>&1";
  const int rc = std::system(cmd.c_str());
  const Bytes log = slurp(dir + "/py.log");
  ASSERT_EQ(rc, 0) << "Python could not read our file or write its own:\n" << std::string(log.begin(), log.end());

  const io::TensorFile f = io::read_safetensors(dir + "/python.safetensors");
  EXPECT_EQ(f.metadata.at("made_by"), "python");
  EXPECT_EQ(f.metadata.at("n"), std::to_string(ours.size() + 5));
  ASSERT_EQ(f.tensors.size(), ours.size() + 5);
  for (const auto& [n, t] : ours) {
    ASSERT_NE(f.find(n), nullptr) << n;
    expect_same_tensor(*f.find(n), t, n);
  }
  const Tensor& ar = *f.find("py.arange");
  ASSERT_EQ(ar.desc(), Tensor::empty({2, 3, 4}, DType::F32).desc());
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(ar.item_f64(i), double(i));
  const Tensor& thirds = *f.find("py.bf16_thirds");
  ASSERT_EQ(thirds.dtype(), DType::BF16);
  for (int64_t i = 0; i < 10; ++i)
    EXPECT_EQ(thirds.data<uint16_t>()[i], f32_to_bf16(float(i) / 3.f)) << "torch and td round bf16 differently";
  const Tensor& i64 = *f.find("py.i64");
  ASSERT_EQ(i64.dtype(), DType::I64);
  const int64_t want_i64[] = {-(int64_t(1) << 62), -1, 0, (int64_t(1) << 40) + 7};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(i64.data<int64_t>()[i], want_i64[i]);
  const Tensor& b = *f.find("py.bool");
  ASSERT_EQ(b.dtype(), DType::Bool);
  ASSERT_EQ(b.shape(), (Shape{1, 3}));
  EXPECT_EQ(b.data<uint8_t>()[0], 1);
  EXPECT_EQ(b.data<uint8_t>()[1], 0);
  EXPECT_EQ(b.data<uint8_t>()[2], 1);
  const Tensor& sc = *f.find("py.scalar");
  ASSERT_EQ(sc.dtype(), DType::F16);
  EXPECT_EQ(sc.dim(), 0);
  EXPECT_EQ(sc.item_f64(0), 2.5);
}

}  // namespace
}  // namespace td
