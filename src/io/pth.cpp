#include "io/pth.h"

#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "io/mapped_file.h"
#include "io/pickle.h"
#include "io/zip.h"

namespace td::io {
namespace {

using pickle::Kind;
using pickle::Value;

constexpr int kMaxNesting = 64;            // dict/list levels above a leaf
constexpr size_t kMaxNameBytes = 4096;     // a flattened name (tensor names are ~60 bytes)
constexpr size_t kMaxRank = 64;            // torch's own limit on tensor dimensions

// Python's pickle of torch.save(..., _use_new_zipfile_serialization=False)
// starts with protocol 2 and the LONG1 magic number 0x1950a86a20f9469cfc6c.
constexpr uint8_t kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

// A dtype as torch spells it, mapped to ours; nullopt: a real torch dtype we do not support.
struct TorchDType {
  std::string_view name;
  std::optional<DType> dtype;
};
constexpr TorchDType kTorchDTypes[] = {
    {"float64", DType::F64},       {"float32", DType::F32},          {"float16", DType::F16},
    {"bfloat16", DType::BF16},     {"float8_e4m3fn", DType::F8E4M3}, {"float8_e5m2", DType::F8E5M2},
    {"int64", DType::I64},         {"int32", DType::I32},            {"int16", DType::I16},
    {"int8", DType::I8},           {"uint8", DType::U8},             {"bool", DType::Bool},
    {"complex32", std::nullopt},   {"complex64", std::nullopt},      {"complex128", std::nullopt},
    {"uint16", std::nullopt},      {"uint32", std::nullopt},         {"uint64", std::nullopt},
    {"float8_e4m3fnuz", std::nullopt}, {"float8_e5m2fnuz", std::nullopt}, {"float8_e8m0fnu", std::nullopt},
};

// The legacy typed storage classes torch.save names in persistent ids.
constexpr TorchDType kTorchStorages[] = {
    {"DoubleStorage", DType::F64}, {"FloatStorage", DType::F32},   {"HalfStorage", DType::F16},
    {"BFloat16Storage", DType::BF16}, {"LongStorage", DType::I64}, {"IntStorage", DType::I32},
    {"ShortStorage", DType::I16},  {"CharStorage", DType::I8},     {"ByteStorage", DType::U8},
    {"BoolStorage", DType::Bool},  {"ComplexFloatStorage", std::nullopt}, {"ComplexDoubleStorage", std::nullopt},
};

const TorchDType* find_in(std::span<const TorchDType> table, std::string_view name) {
  for (const auto& t : table)
    if (t.name == name) return &t;
  return nullptr;
}

bool allowed_global(std::string_view module, std::string_view name) {
  if (module == "collections") return name == "OrderedDict";
  if (module == "torch._utils")
    return name == "_rebuild_tensor_v2" || name == "_rebuild_tensor_v3" || name == "_rebuild_parameter" ||
           name == "_rebuild_parameter_with_state";
  if (module == "torch.storage") return name == "UntypedStorage";
  if (module == "torch") return find_in(kTorchStorages, name) || find_in(kTorchDTypes, name);
  return false;
}

std::string join(const std::string& prefix, std::string_view part, const std::string& file) {
  TD_CHECK(prefix.size() + part.size() < kMaxNameBytes, Format, file, ": a flattened name longer than ", kMaxNameBytes,
           " bytes under '", prefix.substr(0, 80), "...'");
  return prefix.empty() ? std::string(part) : prefix + "." + std::string(part);
}

std::string scalar_text(const Value& v) {
  switch (v.kind) {
    case Kind::None: return "None";
    case Kind::Bool: return v.boolean ? "True" : "False";
    case Kind::Int: return std::to_string(v.integer);
    case Kind::Float: {
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof buf, v.real);  // shortest round-trip form
      return std::string(buf, r.ptr);
    }
    case Kind::String: return v.text;
    case Kind::Bytes: return cat("<", v.text.size(), " bytes>");
    case Kind::Global: return v.global_name();
    default: return "";
  }
}

// a * b + c without overflow, or nullopt.
std::optional<uint64_t> mul_add(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t m;
  if (__builtin_mul_overflow(a, b, &m)) return std::nullopt;
  uint64_t s;
  if (__builtin_add_overflow(m, c, &s)) return std::nullopt;
  return s;
}

struct StorageView {
  std::shared_ptr<Storage> storage;  // the whole zip entry
  DType element = DType::U8;         // the persistent id's element type (U8 for UntypedStorage)
  bool element_supported = true;
  std::string type_name;             // "torch.FloatStorage", for messages
  uint64_t declared_bytes = 0;       // numel * element size, <= the entry's size
  std::string key;
};

class Reader {
 public:
  // max_visits bounds the walk: a pickle can reference one sub-object from many
  // places (a DAG of n objects can expand to 2^n leaves); plain state dicts visit
  // each object about once.
  Reader(std::shared_ptr<const void> owner, const zip::Archive& zip, std::string prefix, const std::string& name,
         size_t max_visits)
      : owner_(std::move(owner)), zip_(zip), prefix_(std::move(prefix)), name_(name), max_visits_(max_visits) {}

  void walk(const Value* v, const std::string& path, int depth) {
    if (++visits_ > max_visits_)
      fail(ErrorKind::Format, name_, ": the pickled object expands to more than ", max_visits_,
           " entries (shared sub-objects referenced over and over)");
    TD_CHECK(depth <= kMaxNesting, Format, name_, ": the pickled object nests deeper than ", kMaxNesting, " levels at '",
             path, "' (or contains itself)");
    switch (v->kind) {
      case Kind::Dict:
        for (const auto& [k, val] : v->entries) {
          std::string key;
          if (k->is(Kind::String)) key = k->text;
          else if (k->is(Kind::Int)) key = std::to_string(k->integer);
          else fail(ErrorKind::Format, name_, ": a dict at '", path, "' has a key that is a ", pickle::describe(*k),
                    " (expected a string or an int)");
          walk(val, join(path, key, name_), depth + 1);
        }
        return;
      case Kind::List:
      case Kind::Tuple:
        for (size_t i = 0; i < v->items.size(); ++i) walk(v->items[i], join(path, std::to_string(i), name_), depth + 1);
        return;
      case Kind::Reduce:
        add_tensor(path.empty() ? "tensor" : path, build_tensor(*v, path));
        return;
      case Kind::PersistentId:
        fail(ErrorKind::Format, name_, ": '", path, "' is a bare storage, not a tensor; only tensors are read");
      default:
        add_metadata(path.empty() ? "value" : path, scalar_text(*v));
        return;
    }
  }

  TensorFile take() { return std::move(out_); }
  TensorFile& out() { return out_; }

 private:
  void claim_name(const std::string& n) {
    TD_CHECK(names_.insert(n).second, Format, name_, ": two entries of the checkpoint flatten to the same name '", n,
             "' (a key containing '.' collides with a nested dict)");
  }
  void add_tensor(const std::string& n, Tensor t) {
    claim_name(n);
    out_.tensors.emplace_back(n, std::move(t));
  }
  void add_metadata(const std::string& n, std::string text) {
    claim_name(n);
    out_.metadata.emplace(n, std::move(text));
  }

  int64_t need_int(const Value* v, const std::string& tensor, const char* what) {
    TD_CHECK(v->is(Kind::Int), Format, name_, ": tensor '", tensor, "': ", what, " is a ", pickle::describe(*v),
             " (expected an int)");
    return v->integer;
  }
  std::vector<int64_t> need_int_tuple(const Value* v, const std::string& tensor, const char* what) {
    TD_CHECK(v->is(Kind::Tuple) || v->is(Kind::List), Format, name_, ": tensor '", tensor, "': ", what, " is a ",
             pickle::describe(*v), " (expected a tuple of ints)");
    TD_CHECK(v->items.size() <= kMaxRank, Format, name_, ": tensor '", tensor, "': ", what, " has ", v->items.size(),
             " dimensions (at most ", kMaxRank, ")");
    std::vector<int64_t> r;
    r.reserve(v->items.size());
    for (const Value* x : v->items) r.push_back(need_int(x, tensor, what));
    return r;
  }

  // ('storage', storage_type, key, location, numel) -> the entry <prefix>/data/<key>.
  StorageView resolve_storage(const Value* v, const std::string& tensor) {
    TD_CHECK(v->is(Kind::PersistentId), Format, name_, ": tensor '", tensor, "': storage argument is a ",
             pickle::describe(*v), " (expected a persistent id)");
    const Value* pid = v->args;
    TD_CHECK(pid->is(Kind::Tuple) && pid->items.size() == 5, Format, name_, ": tensor '", tensor,
             "': persistent id is a ", pickle::describe(*pid), " (expected ('storage', type, key, location, numel))");
    const Value* tag = pid->items[0];
    const Value* type = pid->items[1];
    const Value* key = pid->items[2];
    const Value* location = pid->items[3];
    TD_CHECK(tag->is(Kind::String) && tag->text == "storage", Format, name_, ": tensor '", tensor,
             "': persistent id starts with ", pickle::describe(*tag), " (expected 'storage')");
    TD_CHECK(key->is(Kind::String), Format, name_, ": tensor '", tensor, "': storage key is a ", pickle::describe(*key));
    TD_CHECK(location->is(Kind::String), Format, name_, ": tensor '", tensor, "': storage location is a ",
             pickle::describe(*location));
    TD_CHECK(type->is(Kind::Global), Format, name_, ": tensor '", tensor, "': storage type is a ", pickle::describe(*type));
    const int64_t numel = need_int(pid->items[4], tensor, "storage size");
    TD_CHECK(numel >= 0, Format, name_, ": tensor '", tensor, "': storage '", key->text, "' has negative size ", numel);

    StorageView sv;
    sv.key = key->text;
    sv.type_name = type->global_name();
    if (type->text == "torch.storage" && type->name == "UntypedStorage") {
      sv.element = DType::U8;
    } else if (const TorchDType* t = type->text == "torch" ? find_in(kTorchStorages, type->name) : nullptr) {
      sv.element_supported = t->dtype.has_value();
      sv.element = t->dtype.value_or(DType::U8);
    } else {
      fail(ErrorKind::Format, name_, ": tensor '", tensor, "': storage type ", sv.type_name, " is not a storage class");
    }
    const zip::Entry* entry = zip_.find(prefix_ + "/data/" + sv.key);
    TD_CHECK(entry, Format, name_, ": tensor '", tensor, "' refers to storage '", sv.key, "' but the archive has no entry '",
             prefix_, "/data/", sv.key, "'");
    const auto bytes = zip_.stored_bytes(*entry);
    const auto declared = mul_add(uint64_t(numel), dtype_size(sv.element), 0);
    TD_CHECK(declared && *declared <= bytes.size(), Format, name_, ": tensor '", tensor, "': storage '", sv.key, "' holds ",
             numel, " elements of ", sv.type_name, " (", dtype_size(sv.element), " bytes each) but its entry has only ",
             bytes.size(), " bytes");
    sv.declared_bytes = *declared;

    auto it = storages_.find(sv.key);
    if (it == storages_.end()) {
      std::shared_ptr<Storage> st;
      if (reinterpret_cast<uintptr_t>(bytes.data()) % 8 == 0) {
        st = Storage::borrow(const_cast<uint8_t*>(bytes.data()), bytes.size(), Device::cpu(), owner_);
      } else {
        // Only hand-made archives get here (torch aligns entries to 64 bytes):
        // copy so that typed loads from the tensor are aligned.
        st = Storage::allocate(bytes.size(), Device::cpu());
        if (!bytes.empty()) std::memcpy(st->data(), bytes.data(), bytes.size());
      }
      it = storages_.emplace(sv.key, std::move(st)).first;
    }
    sv.storage = it->second;
    return sv;
  }

  Tensor build_tensor(const Value& call, const std::string& tensor) {
    const std::string fn = call.global_name();
    const auto& args = call.args->items;
    if (fn == "torch._utils._rebuild_parameter" || fn == "torch._utils._rebuild_parameter_with_state") {
      const size_t want = fn == "torch._utils._rebuild_parameter" ? 3 : 4;
      TD_CHECK(args.size() == want, Format, name_, ": tensor '", tensor, "': ", fn, " called with ", args.size(),
               " arguments (expected ", want, ")");
      const Value* data = args[0];
      TD_CHECK(data->is(Kind::Reduce) && (data->global_name() == "torch._utils._rebuild_tensor_v2" ||
                                          data->global_name() == "torch._utils._rebuild_tensor_v3"),
               Format, name_, ": tensor '", tensor, "': parameter data is a ", pickle::describe(*data),
               " (expected a tensor)");
      return build_tensor(*data, tensor);
    }
    const bool v3 = fn == "torch._utils._rebuild_tensor_v3";
    TD_CHECK(v3 || fn == "torch._utils._rebuild_tensor_v2", Format, name_, ": '", tensor, "' is a ", pickle::describe(call),
             ", which is not a tensor");
    // v2: (storage, offset, size, stride, requires_grad, hooks[, metadata])
    // v3: (storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])
    const size_t min_args = v3 ? 7 : 6;
    TD_CHECK(args.size() == min_args || args.size() == min_args + 1, Format, name_, ": tensor '", tensor, "': ", fn,
             " called with ", args.size(), " arguments (expected ", min_args, " or ", min_args + 1, ")");
    const StorageView sv = resolve_storage(args[0], tensor);
    const int64_t offset = need_int(args[1], tensor, "storage offset");
    const std::vector<int64_t> size = need_int_tuple(args[2], tensor, "size");
    const std::vector<int64_t> stride = need_int_tuple(args[3], tensor, "stride");
    TD_CHECK(args[4]->is(Kind::Bool), Format, name_, ": tensor '", tensor, "': requires_grad is a ",
             pickle::describe(*args[4]));

    DType dtype = sv.element;
    if (v3) {
      const Value* d = args[6];
      const TorchDType* t = d->is(Kind::Global) && d->text == "torch" ? find_in(kTorchDTypes, d->name) : nullptr;
      TD_CHECK(t, Format, name_, ": tensor '", tensor, "': dtype argument is a ", pickle::describe(*d));
      TD_CHECK(t->dtype.has_value(), DType, name_, ": tensor '", tensor, "' has dtype torch.", t->name,
               ", which turbodiff does not support");
      TD_CHECK(sv.element == DType::U8 && sv.element_supported, Format, name_, ": tensor '", tensor, "': ", fn,
               " with a typed storage ", sv.type_name, " (expected torch.storage.UntypedStorage)");
      dtype = *t->dtype;
    } else {
      TD_CHECK(sv.element_supported, DType, name_, ": tensor '", tensor, "' is stored as ", sv.type_name,
               ", a dtype turbodiff does not support");
    }

    TD_CHECK(size.size() == stride.size(), Format, name_, ": tensor '", tensor, "': size ", shape_str(size),
             " and stride ", shape_str(stride), " differ in rank");
    TD_CHECK(offset >= 0, Format, name_, ": tensor '", tensor, "': negative storage offset ", offset);
    const uint64_t esize = dtype_size(dtype);
    const uint64_t storage_elems = sv.declared_bytes / esize;
    // Elements from the first to the furthest one the view reaches, with every
    // step checked for overflow: a hostile size * stride must not wrap around.
    uint64_t numel = 1, last = uint64_t(offset);
    bool overflow = false;
    for (size_t i = 0; i < size.size(); ++i) {
      TD_CHECK(size[i] >= 0 && stride[i] >= 0, Format, name_, ": tensor '", tensor, "': size ", shape_str(size),
               " and stride ", shape_str(stride), " must not be negative");
      if (size[i] == 0) numel = 0;
    }
    for (size_t i = 0; i < size.size() && numel != 0; ++i) {
      auto n = mul_add(numel, uint64_t(size[i]), 0);
      auto l = mul_add(uint64_t(size[i] - 1), uint64_t(stride[i]), last);
      if (!n || !l || *n > uint64_t(std::numeric_limits<int64_t>::max())) { overflow = true; break; }
      numel = *n;
      last = *l;
    }
    TD_CHECK(!overflow, Format, name_, ": tensor '", tensor, "': size ", shape_str(size), " with stride ",
             shape_str(stride), " overflows 64-bit indexing");
    if (numel == 0) {
      TD_CHECK(uint64_t(offset) <= storage_elems, Format, name_, ": tensor '", tensor, "': storage offset ", offset,
               " is past the end of storage '", sv.key, "' (", storage_elems, " elements)");
    } else {
      TD_CHECK(last < storage_elems, Format, name_, ": tensor '", tensor, "' (", dtype_name(dtype), shape_str(size),
               ", stride ", shape_str(stride), ", storage offset ", offset, ") reaches element ", last,
               " but storage '", sv.key, "' holds ", storage_elems, " elements of ", esize, " bytes");
    }
    return Tensor(sv.storage, dtype, size, stride, size_t(uint64_t(offset) * esize));
  }

  std::shared_ptr<const void> owner_;
  const zip::Archive& zip_;
  std::string prefix_;
  const std::string& name_;
  std::unordered_map<std::string, std::shared_ptr<Storage>> storages_;
  std::unordered_set<std::string> names_;
  size_t max_visits_;
  size_t visits_ = 0;
  TensorFile out_;
};

[[noreturn]] void explain_not_zip(const uint8_t* data, size_t size, const std::string& name) {
  if (size >= sizeof kLegacyMagic && std::memcmp(data, kLegacyMagic, sizeof kLegacyMagic) == 0)
    fail(ErrorKind::Unsupported, name,
         " uses the legacy torch.save format of PyTorch < 1.6 (a bare pickle stream, not a zip archive); re-save it "
         "with a current PyTorch: torch.save(torch.load(path), new_path)");
  if (size >= 2 && data[0] == 0x80 && data[1] <= 5)
    fail(ErrorKind::Format, name, " is a bare pickle stream, not a torch.save zip archive (legacy PyTorch < 1.6 format "
         "or a plain pickle); re-save it with a current PyTorch's torch.save");
  if (size >= 263 && std::memcmp(data + 257, "ustar", 5) == 0)
    fail(ErrorKind::Unsupported, name, " is a tar archive: the torch.save format of PyTorch < 0.4; re-save it with a "
         "current PyTorch's torch.save");
  if (size >= 9 && data[8] == '{')
    fail(ErrorKind::Format, name, " looks like a safetensors file, not a PyTorch .pth checkpoint");
  fail(ErrorKind::Format, name, " is not a PyTorch checkpoint: it is neither a torch.save zip archive nor a legacy "
       "pickle (", size, " bytes)");
}

}  // namespace

bool looks_like_pth(const uint8_t* data, size_t size) {
  return zip::looks_like_zip(data, size) ||
         (size >= sizeof kLegacyMagic && std::memcmp(data, kLegacyMagic, sizeof kLegacyMagic) == 0);
}

TensorFile parse_pth(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                     const std::string& name_for_errors) {
  const std::string& name = name_for_errors;
  if (!zip::looks_like_zip(data, size)) explain_not_zip(data, size, name);
  const zip::Archive zip = zip::Archive::parse(data, size, name);

  // <prefix>/data.pkl, where prefix is the archive's single top folder.
  const zip::Entry* pkl = nullptr;
  for (const zip::Entry& e : zip.entries()) {
    const size_t slash = e.name.find('/');
    if (slash == std::string::npos || e.name.compare(slash, std::string::npos, "/data.pkl") != 0) continue;
    TD_CHECK(!pkl, Format, name, ": the archive holds two pickles, '", pkl ? pkl->name : "", "' and '", e.name,
             "'; a torch.save archive has exactly one <prefix>/data.pkl");
    pkl = &e;
  }
  if (!pkl) {
    std::string listing;
    for (size_t i = 0; i < zip.entries().size() && i < 5; ++i) listing += (i ? ", " : "") + zip.entries()[i].name;
    fail(ErrorKind::Format, name, ": zip archive without a <prefix>/data.pkl entry, so not a torch.save checkpoint (",
         zip.entries().size(), " entries", listing.empty() ? "" : ": ", listing, zip.entries().size() > 5 ? ", ..." : "",
         ")");
  }
  const std::string prefix = pkl->name.substr(0, pkl->name.size() - std::strlen("/data.pkl"));
  TD_CHECK(!zip.find(prefix + "/constants.pkl"), Unsupported, name,
           " is a TorchScript archive (torch.jit.save), not a torch.save checkpoint; save the model's state_dict() "
           "with torch.save instead");
  if (const zip::Entry* bo = zip.find(prefix + "/byteorder")) {
    const auto b = zip.stored_bytes(*bo);
    const std::string order(reinterpret_cast<const char*>(b.data()), b.size());
    TD_CHECK(order == "little", Unsupported, name, ": ", bo->name, " says '", order.substr(0, 16),
             "'; only little-endian checkpoints can be read in place");
  }

  const std::string pkl_name = name + ":" + pkl->name;
  const pickle::Document doc = pickle::unpickle(zip.stored_bytes(*pkl), allowed_global, pkl_name);
  Reader reader(std::move(owner), zip, prefix, name, 4 * doc.object_count() + 1024);
  reader.walk(doc.root(), "", 0);
  TensorFile out = reader.take();
  out.path = name;
  out.format = "pth";
  return out;
}

TensorFile read_pth(const std::string& path) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  const uint8_t* data = file->data();
  const size_t size = file->size();
  return parse_pth(std::move(file), data, size, path);
}

}  // namespace td::io
