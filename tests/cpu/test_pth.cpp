// PyTorch .pth reader: the fixtures written by torch.save (scripts/make_io_fixtures.py)
// compared against expected.json, archives and pickles built here from fresh
// random data, and hostile input (truncated, corrupted, compressed, unknown
// globals, malicious opcodes, views outside their storage, legacy files). Every
// bad input must give a td::Error, never a crash, a hang or another exception.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "harness/harness.h"
#include "io/pickle.h"
#include "io/pth.h"
#include "io/zip.h"
#if __has_include("io/safetensors.h")
#include "io/safetensors.h"
#define TD_TEST_HAVE_SAFETENSORS 1
#endif

namespace td {
namespace {

using json = nlohmann::json;
using Bytes = std::vector<uint8_t>;

// ---- helpers -----------------------------------------------------------------------

std::string fixture_dir() { return test::source_dir() + "/fixtures/io"; }

Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

const json& expected() {
  static const json j = json::parse(std::ifstream(fixture_dir() + "/expected.json"));
  return j;
}

// Parses from a heap copy of exactly bytes.size() bytes (so sanitizers see over-reads).
io::TensorFile parse(const Bytes& bytes, const std::string& name = "test.pth") {
  std::shared_ptr<uint8_t[]> copy(new uint8_t[std::max<size_t>(bytes.size(), 1)]);
  if (!bytes.empty()) std::memcpy(copy.get(), bytes.data(), bytes.size());
  return io::parse_pth(copy, copy.get(), bytes.size(), name);
}

struct Failure {
  bool threw_td = false;
  ErrorKind kind = ErrorKind::Internal;
  std::string message;
};
template <typename F>
Failure failure_of(F&& f) {
  Failure r;
  try {
    f();
  } catch (const Error& e) {
    r.threw_td = true;
    r.kind = e.kind();
    r.message = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-td exception: " << e.what();
  }
  return r;
}
#define EXPECT_TD_ERROR(expr, expected_kind, ...)                                                  \
  do {                                                                                             \
    const Failure _f = failure_of([&] { (void)(expr); });                                          \
    ASSERT_TRUE(_f.threw_td) << #expr << " did not throw td::Error";                               \
    EXPECT_EQ(error_kind_name(_f.kind), error_kind_name(ErrorKind::expected_kind)) << _f.message;  \
    for (const char* _s : std::initializer_list<const char*>{__VA_ARGS__}) {                      \
      EXPECT_NE(_f.message.find(_s), std::string::npos) << "message lacks '" << _s << "': " << _f.message; \
    }                                                                                              \
  } while (0)

// Bytes of element i (row-major) of a host tensor of any layout.
const uint8_t* element_ptr(const Tensor& t, int64_t flat) {
  int64_t off = 0, rem = flat;
  for (size_t k = t.shape().size(); k-- > 0;) {
    off += (rem % t.shape()[k]) * t.strides()[k];
    rem /= t.shape()[k];
  }
  return static_cast<const uint8_t*>(t.raw_data()) + size_t(off) * dtype_size(t.dtype());
}

uint64_t fnv1a64_row_major(const Tensor& t) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint8_t* p = element_ptr(t, i);
    for (size_t b = 0; b < dtype_size(t.dtype()); ++b) h = (h ^ p[b]) * 0x100000001b3ull;
  }
  return h;
}

void expect_matches(const Tensor& t, const json& e, const std::string& where) {
  SCOPED_TRACE(where);
  ASSERT_TRUE(t.defined());
  EXPECT_EQ(dtype_name(t.dtype()), e["dtype"].get<std::string>());
  EXPECT_EQ(t.shape(), e["shape"].get<std::vector<int64_t>>());
  if (t.shape() != e["shape"].get<std::vector<int64_t>>()) return;
  const auto& first = e["first"];
  for (size_t i = 0; i < first.size(); ++i)
    EXPECT_EQ(t.item_f64(int64_t(i)), first[i].get<double>()) << "element " << i;  // exact: all dtypes fit f64
  double sum = 0, abs_sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) sum += t.item_f64(i), abs_sum += std::fabs(t.item_f64(i));
  // torch sums in another order; 1e-12 of the magnitude is far below one ulp of any stored element.
  EXPECT_NEAR(sum, e["sum"].get<double>(), 1e-12 * std::max(1.0, abs_sum));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64_row_major(t)));
  EXPECT_EQ(std::string(hex), e["fnv1a64"].get<std::string>()) << "row-major bytes differ";
}

void expect_file_matches(const io::TensorFile& f, const json& e, bool ordered) {
  const auto& tensors = e["tensors"];
  ASSERT_EQ(f.tensors.size(), tensors.size()) << f.path;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = tensors[i]["name"];
    if (ordered) {
      EXPECT_EQ(f.tensors[i].first, name) << f.path << " tensor " << i;
    }
    const Tensor* t = f.find(name);
    ASSERT_NE(t, nullptr) << f.path << " lacks " << name;
    expect_matches(*t, tensors[i], f.path + ": " + name);
  }
  const std::map<std::string, std::string> meta = e["metadata"].get<std::map<std::string, std::string>>();
  EXPECT_EQ(f.metadata, meta) << f.path;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ---- writing pickles and archives --------------------------------------------------

// Emits pickle opcodes (the subset torch.save uses, and some it never would).
struct Pk {
  std::string b;
  Pk& op(uint8_t c) { b.push_back(char(c)); return *this; }
  Pk& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(char((v >> (8 * i)) & 0xff));
    return *this;
  }
  Pk& proto(int v = 2) { return op(0x80).op(uint8_t(v)); }
  Pk& str(std::string_view s) { op('X').le(s.size(), 4); b += s; return *this; }
  Pk& integer(int64_t v) {
    if (v >= 0 && v < 256) return op('K').op(uint8_t(v));
    if (v >= INT32_MIN && v <= INT32_MAX) return op('J').le(uint64_t(uint32_t(int32_t(v))), 4);
    return op(0x8a).op(8).le(uint64_t(v), 8);
  }
  Pk& global(std::string_view m, std::string_view n) { op('c'); b += m; b += '\n'; b += n; b += '\n'; return *this; }
  Pk& stack_global(std::string_view m, std::string_view n) {
    op(0x8c).op(uint8_t(m.size())); b += m;
    op(0x8c).op(uint8_t(n.size())); b += n;
    return op(0x93);
  }
  Pk& mark() { return op('('); }
  Pk& tuple() { return op('t'); }
  Pk& empty_tuple() { return op(')'); }
  Pk& empty_dict() { return op('}'); }
  Pk& empty_list() { return op(']'); }
  Pk& setitems() { return op('u'); }
  Pk& setitem() { return op('s'); }
  Pk& reduce() { return op('R'); }
  Pk& persid() { return op('Q'); }
  Pk& none() { return op('N'); }
  Pk& put(uint8_t i) { return op('q').op(i); }
  Pk& get(uint8_t i) { return op('h').op(i); }
  Pk& stop() { return op('.'); }
  Pk& ints(const std::vector<int64_t>& v) {
    mark();
    for (int64_t x : v) integer(x);
    return tuple();
  }
  // torch._utils._rebuild_tensor_v2(('storage', torch.<type>, key, 'cpu', numel), offset, size, stride, False, OrderedDict())
  Pk& tensor(std::string_view storage_type, std::string_view key, int64_t numel, int64_t offset,
             const std::vector<int64_t>& size, const std::vector<int64_t>& stride) {
    global("torch._utils", "_rebuild_tensor_v2").mark();
    mark().str("storage").global("torch", storage_type).str(key).str("cpu").integer(numel).tuple().persid();
    integer(offset).ints(size).ints(stride).op(0x89);
    global("collections", "OrderedDict").empty_tuple().reduce();
    return tuple().reduce();
  }
};

struct ZipSpec {
  std::string name;
  std::string data;
  uint16_t method = 0;
};

void put_le(std::string& s, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}

// A zip laid out like torch's: stored entries, each data start padded (through
// an extra field in the local header only) to `align` bytes plus `misalign`.
// With zip64 the 32-bit fields are saturated and the values live in ZIP64
// extra fields and the ZIP64 end-of-central-directory record.
Bytes build_zip(const std::vector<ZipSpec>& entries, bool zip64 = false, size_t align = 64, size_t misalign = 0) {
  std::string out, cd;
  for (const ZipSpec& e : entries) {
    const uint64_t off = out.size();
    put_le(out, 0x04034b50, 4);
    put_le(out, zip64 ? 45 : 20, 2);
    put_le(out, 0, 2);
    put_le(out, e.method, 2);
    put_le(out, 0, 4);  // time, date
    put_le(out, 0, 4);  // crc (not checked by the reader)
    put_le(out, zip64 ? 0xffffffffu : e.data.size(), 4);
    put_le(out, zip64 ? 0xffffffffu : e.data.size(), 4);
    const size_t base = off + 30 + e.name.size() + (zip64 ? 20 : 0) + 4;
    const size_t pad = (align + misalign - base % align) % align;
    put_le(out, e.name.size(), 2);
    put_le(out, (zip64 ? 20 : 0) + 4 + pad, 2);
    out += e.name;
    if (zip64) {
      put_le(out, 1, 2), put_le(out, 16, 2), put_le(out, e.data.size(), 8), put_le(out, e.data.size(), 8);
    }
    put_le(out, 0x4246, 2), put_le(out, pad, 2), out.append(pad, 'Z');
    out += e.data;

    put_le(cd, 0x02014b50, 4);
    put_le(cd, 45, 2), put_le(cd, zip64 ? 45 : 20, 2), put_le(cd, 0, 2), put_le(cd, e.method, 2);
    put_le(cd, 0, 4), put_le(cd, 0, 4);
    put_le(cd, zip64 ? 0xffffffffu : e.data.size(), 4), put_le(cd, zip64 ? 0xffffffffu : e.data.size(), 4);
    put_le(cd, e.name.size(), 2), put_le(cd, zip64 ? 28 : 0, 2), put_le(cd, 0, 2);
    put_le(cd, 0, 2), put_le(cd, 0, 2), put_le(cd, 0, 4);
    put_le(cd, zip64 ? 0xffffffffu : off, 4);
    cd += e.name;
    if (zip64) put_le(cd, 1, 2), put_le(cd, 24, 2), put_le(cd, e.data.size(), 8), put_le(cd, e.data.size(), 8), put_le(cd, off, 8);
  }
  const uint64_t cd_off = out.size();
  out += cd;
  if (zip64) {
    const uint64_t rec = out.size();
    put_le(out, 0x06064b50, 4), put_le(out, 44, 8), put_le(out, 45, 2), put_le(out, 45, 2);
    put_le(out, 0, 4), put_le(out, 0, 4), put_le(out, entries.size(), 8), put_le(out, entries.size(), 8);
    put_le(out, cd.size(), 8), put_le(out, cd_off, 8);
    put_le(out, 0x07064b50, 4), put_le(out, 0, 4), put_le(out, rec, 8), put_le(out, 1, 4);
  }
  put_le(out, 0x06054b50, 4), put_le(out, 0, 4);
  put_le(out, zip64 ? 0xffff : entries.size(), 2), put_le(out, zip64 ? 0xffff : entries.size(), 2);
  put_le(out, zip64 ? 0xffffffffu : cd.size(), 4), put_le(out, zip64 ? 0xffffffffu : cd_off, 4), put_le(out, 0, 2);
  return Bytes(out.begin(), out.end());
}

std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

// A torch.save-shaped archive around `pickle` with storages data/<key>.
Bytes torch_archive(const std::string& pickle, const std::map<std::string, std::string>& storages = {},
                    bool zip64 = false, std::string prefix = "archive") {
  std::vector<ZipSpec> e{{prefix + "/data.pkl", pickle}, {prefix + "/byteorder", "little"}};
  for (const auto& [k, v] : storages) e.push_back({prefix + "/data/" + k, v});
  e.push_back({prefix + "/version", "3\n"});
  return build_zip(e, zip64);
}

std::string random_f32_bytes(size_t n) {
  std::vector<float> v = test::randn(n);
  return std::string(reinterpret_cast<const char*>(v.data()), n * 4);
}

float f32_at(const std::string& bytes, size_t i) {
  float f;
  std::memcpy(&f, bytes.data() + 4 * i, 4);
  return f;
}

// ---- the fixtures -------------------------------------------------------------------

TEST(Pth, EveryFixtureMatchesExpectedJson) {
  size_t checked = 0;
  for (const auto& [file, e] : expected()["files"].items()) {
    if (!ends_with(file, ".pth") || !e.contains("tensors")) continue;
    SCOPED_TRACE(file);
    const io::TensorFile f = io::read_pth(fixture_dir() + "/" + file);
    EXPECT_EQ(f.format, "pth");
    EXPECT_EQ(f.path, fixture_dir() + "/" + file);
    expect_file_matches(f, e, /*ordered=*/true);
    ++checked;
  }
  EXPECT_GE(checked, 6u) << "expected.json lists too few .pth fixtures";
}

TEST(Pth, ViewsKeepStridesOffsetsAndSharedStorage) {
  for (const char* file : {"misc_tiny.pth", "zip64_tiny.pth"}) {
    SCOPED_TRACE(file);
    const io::TensorFile f = io::read_pth(fixture_dir() + "/" + file);
    for (const auto& [name, v] : expected()["files"][file]["views"].items()) {
      const Tensor* t = f.find(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->strides(), v["stride"].get<std::vector<int64_t>>()) << name;
      EXPECT_EQ(t->byte_offset(), v["storage_offset"].get<size_t>() * dtype_size(t->dtype())) << name;
      if (v.contains("shares_storage_with")) {
        const Tensor* other = f.find(v["shares_storage_with"].get<std::string>());
        ASSERT_NE(other, nullptr);
        EXPECT_EQ(t->storage().get(), other->storage().get()) << name << " should share its storage";
      }
    }
    // Zero-copy: the full tensor's bytes lie inside the file mapping, at 64-byte alignment as torch writes them.
    const Tensor* full = f.find("shared_full");
    ASSERT_NE(full, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(full->raw_data()) % (std::string(file) == "misc_tiny.pth" ? 64 : 4), 0u);
    EXPECT_TRUE(full->is_contiguous());
  }
}

TEST(Pth, QuantizedFixtureFollowsTurboDiffusionFormula) {
  // turbo_tiny_quant.pth was made from turbo_tiny.pth's bf16 weights: per 128x128
  // block, scale = amax / 128 and q = round(w * 128 / amax) saturated to int8, so
  // |q * scale - w| <= scale / 2 (plus fp32 rounding of w * 128 / amax: 1e-6 relative).
  const io::TensorFile quant = io::read_pth(fixture_dir() + "/turbo_tiny_quant.pth");
  const io::TensorFile turbo = io::read_pth(fixture_dir() + "/turbo_tiny.pth");
  size_t linears = 0;
  for (const auto& [name, q] : quant.tensors) {
    if (!ends_with(name, ".int8_weight")) continue;
    const std::string base = name.substr(0, name.size() - std::strlen(".int8_weight"));
    const Tensor* scale = quant.find(base + ".scale");
    const Tensor* w = turbo.find("state_dict.net." + base + ".weight");
    ASSERT_TRUE(scale && w) << base;
    ASSERT_EQ(q.dtype(), DType::I8);
    ASSERT_EQ(scale->dtype(), DType::F32);
    const int64_t n = q.size(0), k = q.size(1);
    ASSERT_EQ(scale->shape(), (Shape{(n + 127) / 128, (k + 127) / 128})) << base;
    ASSERT_EQ(w->shape(), q.shape());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const double s = scale->item_f64((i / 128) * scale->size(1) + j / 128);
        const double wv = w->item_f64(i * k + j), qv = q.item_f64(i * k + j);
        // +amax maps to 128, saturated to 127: a full step off, for that element only.
        const double bound = (qv == 127 ? 1.0 : 0.5) * s + 1e-6 * std::fabs(wv) + 1e-30;
        ASSERT_LE(std::fabs(qv * s - wv), bound) << base << "[" << i << "," << j << "]";
      }
    EXPECT_NE(quant.find(base + ".bias"), nullptr) << base;
    EXPECT_EQ(quant.find(base + ".weight"), nullptr) << base << " must not keep its float weight";
    ++linears;
  }
  EXPECT_EQ(linears, 2u * 10u) << "2 blocks x (4 self + 4 cross + 2 ffn) linears";
  EXPECT_NE(quant.find("blocks.1.self_attn.attn_op.local_attn.proj_l.weight"), nullptr);
}

#ifdef TD_TEST_HAVE_SAFETENSORS
TEST(Pth, SafetensorsTwinsHoldTheSameTensors) {
  const io::TensorFile pth = io::read_pth(fixture_dir() + "/wan_t2v_tiny.pth");
  const io::TensorFile st = io::read_safetensors(fixture_dir() + "/wan_t2v_tiny.safetensors");
  ASSERT_EQ(pth.tensors.size(), st.tensors.size());
  for (const auto& [name, t] : pth.tensors) {
    const Tensor* s = st.find(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->dtype(), t.dtype()) << name;
    EXPECT_EQ(s->shape(), t.shape()) << name;
    EXPECT_EQ(fnv1a64_row_major(*s), fnv1a64_row_major(t)) << name;
  }
  // Every safetensors fixture (the diffusers shards included) against expected.json, by name.
  for (const auto& [file, e] : expected()["files"].items()) {
    if (!ends_with(file, ".safetensors")) continue;
    expect_file_matches(io::read_safetensors(fixture_dir() + "/" + file), e, /*ordered=*/false);
  }
  const io::TensorFile sharded =
      io::read_safetensors_sharded(fixture_dir() + "/diffusers_tiny/diffusion_pytorch_model.safetensors.index.json");
  EXPECT_EQ(sharded.tensors.size(), pth.tensors.size()) << "diffusers renames one-to-one";
  EXPECT_NE(sharded.find("condition_embedder.time_embedder.linear_1.weight"), nullptr);
  EXPECT_NE(sharded.find("blocks.1.attn1.to_q.weight"), nullptr);
  EXPECT_NE(sharded.find("scale_shift_table"), nullptr);
}
#endif

// ---- archives built here from random data ---------------------------------------

TEST(Pth, RandomTensorsRoundTripThroughHandBuiltArchives) {
  auto& rng = test::rng();
  for (int trial = 0; trial < 20; ++trial) {
    // A storage of random floats and a few random views of it (awkward sizes, transposes, offsets, stride 0).
    const int64_t numel = 1 + int64_t(rng() % 300);
    const std::string storage = random_f32_bytes(size_t(numel));
    struct View { std::vector<int64_t> size, stride; int64_t offset; };
    std::vector<View> views;
    for (int k = 0; k < 4; ++k) {
      const int64_t rows = 1 + int64_t(rng() % 7), cols = 1 + int64_t(rng() % 7);
      View v;
      switch (rng() % 3) {
        case 0: v = {{rows, cols}, {cols, 1}, 0}; break;           // contiguous
        case 1: v = {{cols, rows}, {1, cols}, 0}; break;           // transposed
        default: v = {{rows, cols}, {1, 0}, 0}; break;             // expanded
      }
      const int64_t last = (v.size[0] - 1) * v.stride[0] + (v.size[1] - 1) * v.stride[1];
      if (last >= numel) v = {{numel}, {1}, 0};
      else v.offset = int64_t(rng() % uint64_t(numel - last));
      views.push_back(v);
    }
    Pk p;
    p.proto().empty_dict().mark();
    for (size_t k = 0; k < views.size(); ++k)
      p.str("v" + std::to_string(k)).tensor("FloatStorage", "0", numel, views[k].offset, views[k].size, views[k].stride);
    p.setitems().stop();
    const bool zip64 = trial % 2;
    const io::TensorFile f = parse(torch_archive(p.b, {{"0", storage}}, zip64));
    ASSERT_EQ(f.tensors.size(), views.size());
    for (size_t k = 0; k < views.size(); ++k) {
      const Tensor& t = f.tensors[k].second;
      EXPECT_EQ(f.tensors[k].first, "v" + std::to_string(k));
      ASSERT_EQ(t.shape(), views[k].size);
      EXPECT_EQ(t.storage().get(), f.tensors[0].second.storage().get()) << "one storage, shared";
      for (int64_t i = 0; i < t.numel(); ++i) {
        int64_t off = views[k].offset, rem = i;
        for (size_t d = views[k].size.size(); d-- > 0;) off += (rem % views[k].size[d]) * views[k].stride[d], rem /= views[k].size[d];
        ASSERT_EQ(t.item_f64(i), double(f32_at(storage, size_t(off)))) << "view " << k << " element " << i;
      }
    }
  }
}

TEST(Pth, MisalignedStorageIsCopiedAndStillCorrect) {
  const std::string storage = random_f32_bytes(13);
  Pk p;
  p.proto().empty_dict().str("w").tensor("FloatStorage", "0", 13, 2, {11}, {1}).setitem().stop();
  const Bytes zip = build_zip({{"a/data.pkl", p.b}, {"a/data/0", storage}}, false, 8, 3);
  const io::TensorFile f = parse(zip);
  const Tensor* t = f.find("w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->storage()->data()) % 8, 0u);
  for (int64_t i = 0; i < 11; ++i) EXPECT_EQ(t->item_f64(i), double(f32_at(storage, size_t(i) + 2)));
}

TEST(Pth, ZipReaderResolvesDataThroughTheLocalHeader) {
  const std::string a = random_f32_bytes(5), b = "little";
  const Bytes zip = build_zip({{"p/data/0", a}, {"p/byteorder", b}}, true, 64, 0);
  const io::zip::Archive arc = io::zip::Archive::parse(zip.data(), zip.size(), "t.zip");
  ASSERT_EQ(arc.entries().size(), 2u);
  const io::zip::Entry* e = arc.find("p/data/0");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->data_offset % 64, 0u) << "padding lives in the local extra field only";
  EXPECT_EQ(e->compressed_size, a.size());
  const auto bytes = arc.stored_bytes(*e);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), a);
  EXPECT_EQ(arc.find("p/data/1"), nullptr);
}

// ---- hostile input --------------------------------------------------------------------

TEST(PthHostile, TruncatedAtEveryOffset) {
  for (const char* file : {"misc_tiny.pth", "zip64_tiny.pth", "proto4_tiny.pth"}) {
    const Bytes full = read_bytes(fixture_dir() + "/" + file);
    for (size_t cut = 0; cut < full.size(); ++cut) {
      const Failure f = failure_of([&] { parse(Bytes(full.begin(), full.begin() + std::ptrdiff_t(cut))); });
      ASSERT_TRUE(f.threw_td) << file << " truncated to " << cut << " bytes was accepted";
    }
  }
  // The pickle alone truncated at every byte, inside an otherwise valid archive.
  const Bytes misc = read_bytes(fixture_dir() + "/misc_tiny.pth");
  const io::zip::Archive arc = io::zip::Archive::parse(misc.data(), misc.size(), "misc");
  const auto pkl = arc.stored_bytes(*arc.find("misc_tiny/data.pkl"));
  std::map<std::string, std::string> storages;
  for (const auto& e : arc.entries())
    if (e.name.rfind("misc_tiny/data/", 0) == 0) {
      const auto s = arc.stored_bytes(e);
      storages[e.name.substr(std::strlen("misc_tiny/data/"))] = std::string(s.begin(), s.end());
    }
  ASSERT_EQ(parse(torch_archive(std::string(pkl.begin(), pkl.end()), storages)).tensors.size(), 24u);
  for (size_t cut = 0; cut < pkl.size(); ++cut) {
    const Failure f = failure_of([&] { parse(torch_archive(std::string(pkl.begin(), pkl.begin() + cut), storages)); });
    ASSERT_TRUE(f.threw_td) << "pickle truncated to " << cut << " bytes was accepted";
  }
}

// Offsets of the records torch writes at the end of every file.
struct Tail {
  size_t eocd, locator, zip64_record;
};
Tail find_tail(const Bytes& b) {
  Tail t{};
  t.eocd = b.size() - 22;
  t.locator = t.eocd - 20;
  uint64_t rec = 0;
  for (int i = 7; i >= 0; --i) rec = (rec << 8) | b[t.locator + 8 + size_t(i)];
  t.zip64_record = size_t(rec);
  return t;
}

TEST(PthHostile, CorruptedCentralDirectory) {
  const Bytes good = read_bytes(fixture_dir() + "/misc_tiny.pth");
  const Tail tail = find_tail(good);
  ASSERT_EQ(good[tail.zip64_record], 'P');
  uint64_t cd_off = 0;
  for (int i = 7; i >= 0; --i) cd_off = (cd_off << 8) | good[tail.zip64_record + 48 + size_t(i)];
  auto with = [&](size_t at, std::initializer_list<uint8_t> bytes, size_t at2 = 0, std::initializer_list<uint8_t> bytes2 = {}) {
    Bytes b = good;
    size_t k = 0;
    for (uint8_t x : bytes) b[at + k++] = x;
    k = 0;
    for (uint8_t x : bytes2) b[at2 + k++] = x;
    return b;
  };
  EXPECT_TD_ERROR(parse(with(size_t(cd_off), {'X'})), Format, "signature");               // first central header
  EXPECT_TD_ERROR(parse(with(tail.zip64_record + 48, {0x01})), Format, "test.pth");      // directory offset moved
  EXPECT_TD_ERROR(parse(with(tail.zip64_record + 24, {0xff, 0xff}, tail.zip64_record + 32, {0xff, 0xff})), Format,
                  "cannot hold");                                                          // entry count
  EXPECT_TD_ERROR(parse(with(tail.zip64_record + 24, {0x05})), Unsupported, "multi-disk");
  EXPECT_TD_ERROR(parse(with(tail.zip64_record + 40, {0xff, 0xff, 0xff})), Format);      // directory size
  EXPECT_TD_ERROR(parse(with(tail.locator + 8, {0xff, 0xff, 0xff, 0x7f})), Format, "ZIP64");
  EXPECT_TD_ERROR(parse(with(size_t(cd_off) + 28, {0xff, 0x7f})), Format);               // name length
  EXPECT_TD_ERROR(parse(with(size_t(cd_off) + 42, {0x10})), Format, "local header");     // local header offset
  EXPECT_TD_ERROR(parse(with(size_t(cd_off) + 20, {0xff, 0xff, 0xff, 0x0f})), Format);   // compressed size
  EXPECT_TD_ERROR(parse(with(size_t(cd_off) + 34, {0x02})), Unsupported, "disk");        // multi-disk
  EXPECT_TD_ERROR(parse(with(tail.eocd, {'X'})), Format, "end-of-central-directory");
  // Random damage anywhere in the directory and end records: accepted or a td::Error, nothing else.
  auto& rng = test::rng();
  size_t rejected = 0;
  for (int trial = 0; trial < 600; ++trial) {
    Bytes b = good;
    const int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) b[size_t(cd_off) + rng() % (b.size() - size_t(cd_off))] ^= uint8_t(1 + rng() % 255);
    const Failure f = failure_of([&] { parse(b); });
    rejected += f.threw_td;
  }
  EXPECT_GT(rejected, 0u);
}

TEST(PthHostile, ZipDefersToMissingZip64Records) {
  // 0xffffffff sizes with no ZIP64 extra field; an EOCD saying "see ZIP64" with no locator.
  Bytes z = build_zip({{"a/data.pkl", "\x80\x02N."}}, true);
  const io::zip::Archive ok = io::zip::Archive::parse(z.data(), z.size(), "z64");
  EXPECT_EQ(ok.entries().size(), 1u);
  Bytes no_extra = z;
  const size_t cd = to_string(z).find("PK\x01\x02");
  no_extra[cd + 46 + std::strlen("a/data.pkl")] = 0x99;  // extra id 0x0001 -> 0x0099
  EXPECT_TD_ERROR(io::zip::Archive::parse(no_extra.data(), no_extra.size(), "z64"), Format, "ZIP64 extra");
  Bytes no_locator = z;
  const Tail t = find_tail(z);
  no_locator[t.locator] = 'X';
  EXPECT_TD_ERROR(io::zip::Archive::parse(no_locator.data(), no_locator.size(), "z64"), Format, "ZIP64 locator");
}

TEST(PthHostile, CompressedEntryIsAClearError) {
  const std::string storage = random_f32_bytes(4);
  Pk p;
  p.proto().empty_dict().str("w").tensor("FloatStorage", "0", 4, 0, {4}, {1}).setitem().stop();
  EXPECT_TD_ERROR(parse(build_zip({{"a/data.pkl", p.b, 8}, {"a/data/0", storage}})), Unsupported, "a/data.pkl",
                  "compressed", "method 8");
  EXPECT_TD_ERROR(parse(build_zip({{"a/data.pkl", p.b}, {"a/data/0", storage, 8}})), Unsupported, "a/data/0",
                  "compressed");
}

TEST(PthHostile, UnknownGlobalIsRejectedByName) {
  const std::vector<std::pair<std::string, std::string>> globals = {
      {"os", "system"}, {"builtins", "eval"}, {"posix", "system"}, {"subprocess", "Popen"},
      {"numpy.core.multiarray", "_reconstruct"}, {"__main__", "Net"}, {"torch.nn.modules.linear", "Linear"},
      {"torch._utils", "_rebuild_qtensor"}, {"torch", "load"}, {"collections", "defaultdict"}};
  for (const auto& [m, n] : globals) {
    const std::string full = m + "." + n;
    Pk a;
    a.proto().global(m, n).str("echo hi").op(0x85).reduce().stop();
    EXPECT_TD_ERROR(parse(torch_archive(a.b), "evil.pth"), Format, full.c_str(), "evil.pth", "not allowed");
    Pk b;
    b.proto(4).stack_global(m, n).str("x").op(0x85).reduce().stop();
    EXPECT_TD_ERROR(parse(torch_archive(b.b), "evil4.pth"), Format, full.c_str(), "evil4.pth");
  }
}

// Runs a pickle through the reader's own filter-free path with tight limits.
io::pickle::Document unpickle(const std::string& bytes, const io::pickle::Limits& lim = {}) {
  return io::pickle::unpickle({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()},
                              [](std::string_view, std::string_view) { return true; }, "t.pkl", lim);
}

TEST(PthHostile, MaliciousOpcodes) {
  auto pk = [] { Pk p; p.proto(); return p; };
  // Memo abuse.
  EXPECT_TD_ERROR(unpickle(pk().none().op('r').le(0xfffffff0u, 4).stop().b), Format, "memo index");
  EXPECT_TD_ERROR(unpickle(pk().op('j').le(0xfffffff0u, 4).stop().b), Format, "never stored");
  EXPECT_TD_ERROR(unpickle(pk().get(7).stop().b), Format, "never stored");
  {
    io::pickle::Limits lim;
    lim.max_memo = 8;
    Pk p = pk();
    for (int i = 0; i < 10; ++i) p.none().op(0x94).op('0');
    EXPECT_TD_ERROR(unpickle(p.none().stop().b, lim), Format, "memo");
  }
  // Size limits.
  {
    io::pickle::Limits lim;
    lim.max_stack = 64;
    Pk p = pk();
    for (int i = 0; i < 100; ++i) p.none();
    EXPECT_TD_ERROR(unpickle(p.b, lim), Format, "stack deeper");
    Pk m = pk();
    for (int i = 0; i < 100; ++i) m.mark();
    EXPECT_TD_ERROR(unpickle(m.b, lim), Format, "stack deeper");
  }
  {
    io::pickle::Limits lim;
    lim.max_container = 4;
    Pk p = pk();
    p.mark();
    for (int i = 0; i < 5; ++i) p.none();
    EXPECT_TD_ERROR(unpickle(Pk(p).op('l').stop().b, lim), Format, "list with more than 4");
    EXPECT_TD_ERROR(unpickle(Pk(p).tuple().stop().b, lim), Format, "tuple with more than 4");
    Pk d = pk();
    d.empty_dict().mark();
    for (int i = 0; i < 5; ++i) d.integer(i).none();
    EXPECT_TD_ERROR(unpickle(d.setitems().stop().b, lim), Format, "dict with more than 4");
  }
  {
    io::pickle::Limits lim;
    lim.max_string = 16;
    EXPECT_TD_ERROR(unpickle(pk().str(std::string(17, 'a')).stop().b, lim), Format, "limit of 16");
    EXPECT_TD_ERROR(unpickle(pk().op('X').le(0xffffffffu, 4).b + "abc"), Format, "exceeds the limit");
    EXPECT_TD_ERROR(unpickle(pk().op('X').le(100, 4).b + "abc"), Format, "only 3 remain");
    EXPECT_TD_ERROR(unpickle(pk().op(0x8d).le(~0ull, 8).b + "abc"), Format);
  }
  {
    io::pickle::Limits lim;
    lim.max_objects = 10;
    Pk p = pk();
    p.mark();
    for (int i = 0; i < 20; ++i) p.none();
    EXPECT_TD_ERROR(unpickle(p.tuple().stop().b, lim), Format, "objects");
  }
  // Malformed streams.
  EXPECT_TD_ERROR(unpickle(pk().op(0x8a).op(9).le(0x0102030405060708ull, 8).op(0x01).stop().b), Format, "64 bits");
  EXPECT_TD_ERROR(unpickle(pk().op('I').b + "12\n."), Format, "not supported");
  EXPECT_TD_ERROR(unpickle(pk().none().b), Format, "without a STOP");
  EXPECT_TD_ERROR(unpickle(pk().none().none().stop().b), Format, "exactly one");
  EXPECT_TD_ERROR(unpickle(pk().mark().none().stop().b), Format, "exactly one");
  EXPECT_TD_ERROR(unpickle(pk().empty_dict().none().op('a').stop().b), Format, "APPEND");
  EXPECT_TD_ERROR(unpickle(pk().empty_dict().mark().none().setitems().stop().b), Format, "odd number");
  EXPECT_TD_ERROR(unpickle(pk().integer(3).empty_tuple().reduce().stop().b), Format, "only globals");
  EXPECT_TD_ERROR(unpickle(pk().global("torch", "FloatStorage").integer(1).reduce().stop().b), Format, "not a tuple");
  EXPECT_TD_ERROR(unpickle(pk().integer(3).none().op('b').stop().b), Format, "BUILD");
  EXPECT_TD_ERROR(unpickle(pk().none().op(0x86).stop().b), Format, "TUPLE2");
  EXPECT_TD_ERROR(unpickle(pk().op('0').stop().b), Format, "MARK");
  EXPECT_TD_ERROR(unpickle(pk().op('1').stop().b), Format, "MARK");
  EXPECT_TD_ERROR(unpickle(pk().op('t').stop().b), Format, "MARK");
  EXPECT_TD_ERROR(unpickle(pk().op('R').stop().b), Format, "stack is empty");
  EXPECT_TD_ERROR(unpickle(pk().op(0x8c).op(2).b + "\xc3\x28."), Format, "UTF-8");
  EXPECT_TD_ERROR(unpickle(pk().op(0x8c).op(3).b + "\xed\xa0\x80."), Format, "UTF-8");  // lone surrogate
  EXPECT_TD_ERROR(unpickle(Pk().proto(6).none().stop().b), Format, "protocol 6");
  EXPECT_TD_ERROR(unpickle(pk().op(0x95).le(1000, 8).none().stop().b), Format, "FRAME");
  EXPECT_TD_ERROR(unpickle(pk().op('c').b + std::string(5000, 'a')), Format, "newline");
  EXPECT_TD_ERROR(unpickle(pk().integer(1).integer(2).op(0x93).stop().b), Format, "two strings");
  // A valid protocol-4 pickle of the same opcodes, for contrast.
  const auto doc = unpickle(pk().op(0x95).le(3, 8).op(0x88).op(0x94).op('.').b);
  EXPECT_TRUE(doc.root()->is(io::pickle::Kind::Bool));
}

TEST(PthHostile, NestingCyclesAndBlowUpAreBounded) {
  // 100000 nested lists, folded by APPENDs: the reader must stop at its nesting limit, not overflow the stack.
  Pk deep;
  deep.proto();
  deep.b += std::string(100000, ']') + std::string(99999, 'a');
  deep.stop();
  EXPECT_TD_ERROR(parse(torch_archive(deep.b)), Format, "deeper than");
  // A list that contains itself.
  Pk cyc;
  cyc.proto().empty_list().put(0).get(0).op('a').stop();
  EXPECT_TD_ERROR(parse(torch_archive(cyc.b)), Format, "deeper than");
  // 2^48 leaves from 48 levels of [prev, prev]: bounded by the visit limit, quickly.
  Pk dag;
  dag.proto().mark().integer(1).op('l').put(0).op('0');
  for (int k = 1; k <= 48; ++k) dag.mark().get(uint8_t(k - 1)).get(uint8_t(k - 1)).op('l').put(uint8_t(k)).op('0');
  dag.get(48).stop();
  EXPECT_TD_ERROR(parse(torch_archive(dag.b)), Format, "expands to more than");
}

TEST(PthHostile, MissingStorageEntry) {
  Pk p;
  p.proto().empty_dict().str("w").tensor("FloatStorage", "9", 4, 0, {4}, {1}).setitem().stop();
  EXPECT_TD_ERROR(parse(torch_archive(p.b, {{"0", random_f32_bytes(4)}})), Format, "'w'", "archive/data/9");
}

TEST(PthHostile, ViewsOutsideTheirStorage) {
  const std::string st = random_f32_bytes(10);
  auto one = [&](std::string type, int64_t numel, int64_t off, std::vector<int64_t> size, std::vector<int64_t> stride) {
    Pk p;
    p.proto().empty_dict().str("w").tensor(type, "0", numel, off, size, stride).setitem().stop();
    return parse(torch_archive(p.b, {{"0", st}}));
  };
  // The furthest element exactly at the end is fine, one past is not.
  EXPECT_EQ(one("FloatStorage", 10, 0, {2, 5}, {5, 1}).tensors.size(), 1u);
  EXPECT_EQ(one("FloatStorage", 10, 9, {1}, {1}).find("w")->item_f64(0), double(f32_at(st, 9)));
  EXPECT_TD_ERROR(one("FloatStorage", 10, 0, {4, 4}, {4, 1}), Format, "'w'", "reaches element 15", "10 elements");
  EXPECT_TD_ERROR(one("FloatStorage", 10, 9, {2}, {1}), Format, "reaches element 10");
  EXPECT_TD_ERROR(one("FloatStorage", 10, 11, {0}, {1}), Format, "past the end");
  EXPECT_TD_ERROR(one("FloatStorage", 10, -1, {1}, {1}), Format, "negative storage offset");
  EXPECT_TD_ERROR(one("FloatStorage", 10, 0, {2}, {-1}), Format, "negative");
  EXPECT_TD_ERROR(one("FloatStorage", 10, 0, {-2}, {1}), Format, "negative");
  EXPECT_TD_ERROR(one("FloatStorage", 10, 0, {int64_t(1) << 62, 4}, {int64_t(1) << 62, 1}), Format, "overflows");
  EXPECT_TD_ERROR(one("FloatStorage", 10, 0, {2, 2}, {1}), Format, "rank");
  EXPECT_TD_ERROR(one("FloatStorage", 11, 0, {1}, {1}), Format, "only 40 bytes");       // numel past the entry
  EXPECT_TD_ERROR(one("DoubleStorage", 6, 0, {1}, {1}), Format, "only 40 bytes");
  EXPECT_TD_ERROR(one("FloatStorage", -1, 0, {1}, {1}), Format, "negative size");
  EXPECT_TD_ERROR(one("ComplexFloatStorage", 5, 0, {1}, {1}), DType, "torch.ComplexFloatStorage");
  // Stride 0 over a huge size is a valid view of one element.
  const io::TensorFile f = one("FloatStorage", 10, 3, {int64_t(1) << 40}, {0});
  EXPECT_EQ(f.find("w")->numel(), int64_t(1) << 40);
}

TEST(PthHostile, LegacyAndForeignFormats) {
  EXPECT_TD_ERROR(io::read_pth(fixture_dir() + "/legacy_tiny.pth"), Unsupported, "legacy", "re-save", "legacy_tiny.pth");
  EXPECT_TD_ERROR(parse(Bytes{0x80, 0x02, 'N', '.'}), Format, "bare pickle");
  EXPECT_TD_ERROR(parse(read_bytes(fixture_dir() + "/wan_t2v_tiny.safetensors")), Format, "safetensors");
  EXPECT_TD_ERROR(parse(Bytes{}), Format, "not a PyTorch checkpoint");
  EXPECT_TD_ERROR(io::read_pth(test::temp_dir() + "/does_not_exist.pth"), Io, "does_not_exist.pth");
  // A zip without data.pkl, with two pickles, TorchScript, big-endian.
  EXPECT_TD_ERROR(parse(build_zip({{"x/readme.txt", "hi"}})), Format, "data.pkl", "x/readme.txt");
  EXPECT_TD_ERROR(parse(build_zip({{"a/data.pkl", "\x80\x02N."}, {"b/data.pkl", "\x80\x02N."}})), Format, "two pickles");
  EXPECT_TD_ERROR(parse(build_zip({{"m/data.pkl", "\x80\x02N."}, {"m/constants.pkl", "\x80\x02N."}})), Unsupported,
                  "TorchScript");
  EXPECT_TD_ERROR(parse(build_zip({{"a/data.pkl", "\x80\x02N."}, {"a/byteorder", "big"}})), Unsupported, "big");
  EXPECT_TD_ERROR(parse(build_zip({{"a/data.pkl", "\x80\x02N."}, {"a/data.pkl", "\x80\x02N."}})), Format, "twice");
}

TEST(PthHostile, NameCollisionsAndOddKeys) {
  const std::string st = random_f32_bytes(2);
  Pk p;
  p.proto().empty_dict().mark().str("a.b").tensor("FloatStorage", "0", 2, 0, {2}, {1});
  p.str("a").empty_dict().str("b").integer(5).setitem().setitems().stop();
  EXPECT_TD_ERROR(parse(torch_archive(p.b, {{"0", st}})), Format, "same name 'a.b'");
  Pk q;
  q.proto().empty_dict().none().integer(1).setitem().stop();
  EXPECT_TD_ERROR(parse(torch_archive(q.b)), Format, "key");
  // A bare tensor at the top level, and scalars, are named predictably.
  Pk bare;
  bare.proto().tensor("FloatStorage", "0", 2, 0, {2}, {1}).stop();
  EXPECT_NE(parse(torch_archive(bare.b, {{"0", st}})).find("tensor"), nullptr);
  Pk scalar;
  scalar.proto().op('G').le(0, 8).stop();
  EXPECT_EQ(parse(torch_archive(scalar.b)).metadata.at("value"), "0");
}

}  // namespace
}  // namespace td
