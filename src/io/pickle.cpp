#include "io/pickle.h"

#include <cstring>
#include <unordered_map>

#include "core/error.h"

namespace td::io::pickle {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::Bytes: return "bytes";
    case Kind::List: return "list";
    case Kind::Tuple: return "tuple";
    case Kind::Dict: return "dict";
    case Kind::Global: return "global";
    case Kind::Reduce: return "call";
    case Kind::PersistentId: return "persistent id";
  }
  return "?";
}

std::string Value::global_name() const {
  if (kind == Kind::Global) return text + "." + name;
  if (kind == Kind::Reduce && callable) return callable->global_name();
  return "";
}

std::string describe(const Value& v) {
  switch (v.kind) {
    case Kind::None: return "None";
    case Kind::Bool: return v.boolean ? "bool True" : "bool False";
    case Kind::Int: return cat("int ", v.integer);
    case Kind::Float: return cat("float ", v.real);
    case Kind::String: {
      const size_t n = 40;
      return v.text.size() <= n ? cat("string '", v.text, "'") : cat("string '", v.text.substr(0, n), "...'");
    }
    case Kind::Bytes: return cat("bytes of length ", v.text.size());
    case Kind::List: return cat("list of ", v.items.size());
    case Kind::Tuple: return cat("tuple of ", v.items.size());
    case Kind::Dict: return cat("dict of ", v.entries.size());
    case Kind::Global: return cat("global ", v.global_name());
    case Kind::Reduce: return cat("call of ", v.global_name());
    case Kind::PersistentId: return "persistent id";
  }
  return "?";
}

namespace {

// Opcodes (names as in CPython's pickletools).
enum Op : uint8_t {
  MARK = '(', STOP = '.', POP = '0', POP_MARK = '1', DUP = '2',
  BININT = 'J', BININT1 = 'K', BININT2 = 'M', NONE = 'N', BINPERSID = 'Q', REDUCE = 'R',
  BINUNICODE = 'X', EMPTY_LIST = ']', APPEND = 'a', BUILD = 'b', GLOBAL = 'c', DICT = 'd',
  EMPTY_DICT = '}', APPENDS = 'e', BINGET = 'h', LONG_BINGET = 'j', LIST = 'l', BINPUT = 'q',
  LONG_BINPUT = 'r', SETITEM = 's', TUPLE = 't', EMPTY_TUPLE = ')', SETITEMS = 'u', BINFLOAT = 'G',
  BINBYTES = 'B', SHORT_BINBYTES = 'C',
  PROTO = 0x80, NEWOBJ = 0x81, TUPLE1 = 0x85, TUPLE2 = 0x86, TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89,
  LONG1 = 0x8a, LONG4 = 0x8b, SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d, BINBYTES8 = 0x8e,
  STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95,
};

constexpr int kMaxProtocol = 5;
constexpr size_t kMaxGlobalLine = 1024;  // module or attribute name of a GLOBAL

std::string opcode_str(uint8_t op) {
  if (op >= 0x20 && op < 0x7f) return cat("'", char(op), "' (0x", std::hex, int(op), ")");
  return cat("0x", std::hex, int(op));
}

// Strict UTF-8 (no overlongs, no surrogates, at most U+10FFFF), as Python's
// decoder requires for BINUNICODE.
bool valid_utf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07;
    else return false;
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

class Unpickler {
 public:
  Unpickler(std::span<const uint8_t> bytes, const GlobalFilter& allow, const std::string& name, const Limits& limits,
            std::deque<Value>& arena)
      : p_(bytes.data()), n_(bytes.size()), allow_(allow), name_(name), lim_(limits), arena_(arena) {}

  const Value* run() {
    while (true) {
      TD_CHECK(pos_ < n_, Format, name_, ": pickle ends at byte ", n_, " without a STOP opcode (truncated?)");
      op_pos_ = pos_;
      const uint8_t op = p_[pos_++];
      if (op == STOP) {
        if (stack_.size() != 1 || !marks_.empty())
          bad("STOP with ", stack_.size(), " values and ", marks_.size(), " open marks on the stack (expected exactly one value)");
        return stack_.back();
      }
      step(op);
    }
  }

 private:
  template <typename... A>
  [[noreturn]] void bad(A&&... parts) {
    fail(ErrorKind::Format, name_, ": pickle byte ", op_pos_, ": ", std::forward<A>(parts)...);
  }

  // ---- input ----------------------------------------------------------------
  const uint8_t* take(size_t len, const char* what) {
    if (len > n_ - pos_) bad(what, " needs ", len, " bytes but only ", n_ - pos_, " remain (truncated?)");
    const uint8_t* q = p_ + pos_;
    pos_ += len;
    return q;
  }
  uint64_t take_le(size_t len, const char* what) {
    const uint8_t* q = take(len, what);
    uint64_t v = 0;
    for (size_t i = len; i-- > 0;) v = (v << 8) | q[i];
    return v;
  }
  std::string take_line(const char* what) {
    const size_t avail = std::min(n_ - pos_, kMaxGlobalLine + 1);
    const void* nl = std::memchr(p_ + pos_, '\n', avail);
    if (!nl) bad(what, " is not terminated by a newline within ", kMaxGlobalLine, " bytes");
    const size_t len = size_t(static_cast<const uint8_t*>(nl) - (p_ + pos_));
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len + 1;
    return s;
  }

  // ---- values -----------------------------------------------------------------
  Value* make(Kind k) {
    if (arena_.size() >= lim_.max_objects) bad("more than ", lim_.max_objects, " objects (limit)");
    arena_.emplace_back();
    arena_.back().kind = k;
    return &arena_.back();
  }
  void push(const Value* v) {
    if (stack_.size() + marks_.size() >= lim_.max_stack) bad("stack deeper than ", lim_.max_stack, " (limit)");
    stack_.push_back(v);
  }
  const Value* pop(const char* op) {
    if (stack_.size() <= floor()) bad(op, " needs a value but the stack is empty", marks_.empty() ? "" : " above the last MARK");
    const Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  const Value* top(const char* op) {
    if (stack_.size() <= floor()) bad(op, " needs a value but the stack is empty", marks_.empty() ? "" : " above the last MARK");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // Pops everything above the last MARK, and the mark.
  std::vector<const Value*> pop_mark(const char* op) {
    if (marks_.empty()) bad(op, " without a MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<const Value*> items(stack_.begin() + std::ptrdiff_t(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  // Containers are created by this reader and mutated only through these paths.
  Value* mutable_top(const char* op, Kind want) {
    const Value* v = top(op);
    if (v->kind != want) bad(op, " applies to a ", kind_name(want), " but the stack holds a ", describe(*v));
    return const_cast<Value*>(v);
  }
  void check_container(size_t n, const char* what) {
    if (n > lim_.max_container) bad(what, " with more than ", lim_.max_container, " items (limit)");
  }

  void push_int(int64_t v) {
    Value* x = make(Kind::Int);
    x->integer = v;
    push(x);
  }
  // LONG1 / LONG4: little-endian two's complement of any length; must fit in int64.
  void push_long(size_t len) {
    const uint8_t* q = take(len, "LONG");
    if (len == 0) return push_int(0);
    const bool neg = q[len - 1] & 0x80;
    const uint8_t fill = neg ? 0xff : 0x00;
    for (size_t i = 8; i < len; ++i)
      if (q[i] != fill) bad("LONG of ", len, " bytes does not fit in 64 bits");
    uint64_t u = neg ? ~uint64_t(0) : 0;
    const size_t k = std::min<size_t>(len, 8);
    for (size_t i = 0; i < k; ++i) u = (u & ~(uint64_t(0xff) << (8 * i))) | (uint64_t(q[i]) << (8 * i));
    if (len > 8 && (bool(u >> 63) != neg)) bad("LONG of ", len, " bytes does not fit in 64 bits");
    push_int(int64_t(u));
  }
  void push_string(uint64_t len, Kind k) {
    if (len > lim_.max_string) bad(kind_name(k), " of ", len, " bytes exceeds the limit of ", lim_.max_string);
    const uint8_t* q = take(size_t(len), k == Kind::String ? "BINUNICODE" : "BINBYTES");
    if (k == Kind::String && !valid_utf8(q, size_t(len))) bad("BINUNICODE string of ", len, " bytes is not valid UTF-8");
    Value* v = make(k);
    v->text.assign(reinterpret_cast<const char*>(q), size_t(len));
    push(v);
  }
  void push_global(std::string module, std::string attr) {
    if (!allow_(module, attr))
      bad("global '", module, ".", attr,
          "' is not allowed: turbodiff reads plain tensors and state dicts and never runs code from a checkpoint "
          "(torch.load would import and call it)");
    Value* g = make(Kind::Global);
    g->text = std::move(module);
    g->name = std::move(attr);
    push(g);
  }
  void push_tuple(std::vector<const Value*> items) {
    check_container(items.size(), "tuple");
    Value* t = make(Kind::Tuple);
    t->items = std::move(items);
    push(t);
  }
  // REDUCE and NEWOBJ: records callable(*args). collections.OrderedDict() is
  // the one call evaluated here (into an empty Dict, or one built from a list of pairs).
  void push_call(const Value* callable, const Value* args, const char* op) {
    if (!callable->is(Kind::Global)) bad(op, " calls a ", describe(*callable), "; only globals can be called");
    if (!args->is(Kind::Tuple)) bad(op, " arguments for ", callable->global_name(), " are a ", describe(*args), ", not a tuple");
    if (callable->text == "collections" && callable->name == "OrderedDict") {
      Value* d = make(Kind::Dict);
      if (args->items.size() == 1 && args->items[0]->is(Kind::List)) {
        for (const Value* pair : args->items[0]->items) {
          if (!pair->is(Kind::Tuple) || pair->items.size() != 2)
            bad("OrderedDict built from a list holding a ", describe(*pair), " instead of (key, value) pairs");
          d->entries.emplace_back(pair->items[0], pair->items[1]);
        }
      } else if (!args->items.empty()) {
        bad("collections.OrderedDict called with ", describe(*args), " (expected no arguments or one list of pairs)");
      }
      return push(d);
    }
    Value* r = make(Kind::Reduce);
    r->callable = callable;
    r->args = args;
    push(r);
  }
  void memo_put(uint64_t index) {
    if (index >= lim_.max_memo) bad("memo index ", index, " exceeds the limit of ", lim_.max_memo);
    const Value* v = top("memo put");
    auto [it, inserted] = memo_.try_emplace(uint32_t(index), v);
    if (!inserted) it->second = v;
    else if (memo_.size() > lim_.max_memo) bad("more than ", lim_.max_memo, " memo entries (limit)");
  }
  void memo_get(uint64_t index) {
    auto it = index <= UINT32_MAX ? memo_.find(uint32_t(index)) : memo_.end();
    if (it == memo_.end()) bad("memo index ", index, " was never stored (", memo_.size(), " entries)");
    push(it->second);
  }

  void step(uint8_t op) {
    switch (op) {
      case PROTO: {
        const uint64_t v = take_le(1, "PROTO");
        if (v > kMaxProtocol) bad("pickle protocol ", int(v), " is newer than the supported ", kMaxProtocol);
        return;
      }
      case FRAME: {
        const uint64_t len = take_le(8, "FRAME");
        if (len > n_ - pos_) bad("FRAME of ", len, " bytes runs past the end of the pickle (", n_ - pos_, " bytes left)");
        return;
      }
      case MARK:
        if (stack_.size() + marks_.size() >= lim_.max_stack) bad("stack deeper than ", lim_.max_stack, " (limit)");
        marks_.push_back(stack_.size());
        return;
      case POP:
        if (stack_.size() > floor()) stack_.pop_back();
        else pop_mark("POP");  // CPython pops the mark when the stack above it is empty
        return;
      case POP_MARK: pop_mark("POP_MARK"); return;
      case DUP: push(top("DUP")); return;

      case NONE: push(make(Kind::None)); return;
      case NEWTRUE:
      case NEWFALSE: {
        Value* b = make(Kind::Bool);
        b->boolean = op == NEWTRUE;
        push(b);
        return;
      }
      case BININT: push_int(int64_t(int32_t(uint32_t(take_le(4, "BININT"))))); return;
      case BININT1: push_int(int64_t(take_le(1, "BININT1"))); return;
      case BININT2: push_int(int64_t(take_le(2, "BININT2"))); return;
      case LONG1: push_long(size_t(take_le(1, "LONG1"))); return;
      case LONG4: {
        const uint64_t len = take_le(4, "LONG4");
        if (len > n_ - pos_) bad("LONG4 of ", len, " bytes runs past the end of the pickle");
        push_long(size_t(len));
        return;
      }
      case BINFLOAT: {
        const uint8_t* q = take(8, "BINFLOAT");
        uint64_t u = 0;
        for (int i = 0; i < 8; ++i) u = (u << 8) | q[i];  // big-endian
        double d;
        std::memcpy(&d, &u, 8);
        Value* f = make(Kind::Float);
        f->real = d;
        push(f);
        return;
      }
      case SHORT_BINUNICODE: push_string(take_le(1, "SHORT_BINUNICODE"), Kind::String); return;
      case BINUNICODE: push_string(take_le(4, "BINUNICODE"), Kind::String); return;
      case BINUNICODE8: push_string(take_le(8, "BINUNICODE8"), Kind::String); return;
      case SHORT_BINBYTES: push_string(take_le(1, "SHORT_BINBYTES"), Kind::Bytes); return;
      case BINBYTES: push_string(take_le(4, "BINBYTES"), Kind::Bytes); return;
      case BINBYTES8: push_string(take_le(8, "BINBYTES8"), Kind::Bytes); return;

      case EMPTY_LIST: push(make(Kind::List)); return;
      case EMPTY_DICT: push(make(Kind::Dict)); return;
      case EMPTY_TUPLE: push_tuple({}); return;
      case TUPLE: push_tuple(pop_mark("TUPLE")); return;
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        const size_t k = size_t(op - TUPLE1 + 1);
        if (stack_.size() < floor() + k) bad("TUPLE", k, " needs ", k, " values above the last MARK but the stack has ", stack_.size() - floor());
        std::vector<const Value*> items(stack_.end() - std::ptrdiff_t(k), stack_.end());
        stack_.resize(stack_.size() - k);
        push_tuple(std::move(items));
        return;
      }
      case LIST: {
        auto items = pop_mark("LIST");
        check_container(items.size(), "list");
        Value* l = make(Kind::List);
        l->items = std::move(items);
        push(l);
        return;
      }
      case DICT: {
        auto items = pop_mark("DICT");
        if (items.size() % 2) bad("DICT with an odd number (", items.size(), ") of keys and values");
        check_container(items.size() / 2, "dict");
        Value* d = make(Kind::Dict);
        for (size_t i = 0; i < items.size(); i += 2) d->entries.emplace_back(items[i], items[i + 1]);
        push(d);
        return;
      }
      case APPEND: {
        const Value* v = pop("APPEND");
        Value* l = mutable_top("APPEND", Kind::List);
        check_container(l->items.size() + 1, "list");
        l->items.push_back(v);
        return;
      }
      case APPENDS: {
        auto items = pop_mark("APPENDS");
        Value* l = mutable_top("APPENDS", Kind::List);
        check_container(l->items.size() + items.size(), "list");
        l->items.insert(l->items.end(), items.begin(), items.end());
        return;
      }
      case SETITEM: {
        const Value* v = pop("SETITEM");
        const Value* k = pop("SETITEM");
        Value* d = mutable_top("SETITEM", Kind::Dict);
        check_container(d->entries.size() + 1, "dict");
        d->entries.emplace_back(k, v);
        return;
      }
      case SETITEMS: {
        auto items = pop_mark("SETITEMS");
        if (items.size() % 2) bad("SETITEMS with an odd number (", items.size(), ") of keys and values");
        Value* d = mutable_top("SETITEMS", Kind::Dict);
        check_container(d->entries.size() + items.size() / 2, "dict");
        for (size_t i = 0; i < items.size(); i += 2) d->entries.emplace_back(items[i], items[i + 1]);
        return;
      }

      case BINPUT: memo_put(take_le(1, "BINPUT")); return;
      case LONG_BINPUT: memo_put(take_le(4, "LONG_BINPUT")); return;
      case MEMOIZE: memo_put(memo_.size()); return;
      case BINGET: memo_get(take_le(1, "BINGET")); return;
      case LONG_BINGET: memo_get(take_le(4, "LONG_BINGET")); return;

      case GLOBAL: {
        std::string module = take_line("GLOBAL module");
        std::string attr = take_line("GLOBAL name");
        push_global(std::move(module), std::move(attr));
        return;
      }
      case STACK_GLOBAL: {
        const Value* attr = pop("STACK_GLOBAL");
        const Value* module = pop("STACK_GLOBAL");
        if (!module->is(Kind::String) || !attr->is(Kind::String))
          bad("STACK_GLOBAL needs two strings, found ", describe(*module), " and ", describe(*attr));
        push_global(module->text, attr->text);
        return;
      }
      case REDUCE: {
        const Value* args = pop("REDUCE");
        const Value* callable = pop("REDUCE");
        push_call(callable, args, "REDUCE");
        return;
      }
      case NEWOBJ: {
        const Value* args = pop("NEWOBJ");
        const Value* cls = pop("NEWOBJ");
        push_call(cls, args, "NEWOBJ");
        return;
      }
      case BUILD: {
        const Value* state = pop("BUILD");
        const Value* obj = top("BUILD");
        if (obj->is(Kind::Dict)) return;  // an OrderedDict's attributes (a state dict's _metadata): not data
        if (!obj->is(Kind::Reduce)) bad("BUILD on a ", describe(*obj), " (only objects made by a call have state)");
        Value* r = const_cast<Value*>(obj);
        if (r->state) bad("second BUILD on the result of ", r->global_name());
        r->state = state;
        return;
      }
      case BINPERSID: {
        const Value* pid = pop("BINPERSID");
        Value* v = make(Kind::PersistentId);
        v->args = pid;
        push(v);
        return;
      }
      default:
        bad("opcode ", opcode_str(op), " is not supported (torch.save writes pickle protocol 2 without it)");
    }
  }

  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  const GlobalFilter& allow_;
  const std::string& name_;
  const Limits& lim_;
  std::deque<Value>& arena_;
  std::vector<const Value*> stack_;
  std::vector<size_t> marks_;  // stack heights at each open MARK
  std::unordered_map<uint32_t, const Value*> memo_;
};

}  // namespace

Document unpickle(std::span<const uint8_t> bytes, const GlobalFilter& allow_global, const std::string& name_for_errors,
                  const Limits& limits) {
  Document doc;
  Unpickler u(bytes, allow_global, name_for_errors, limits, doc.arena_);
  doc.root_ = u.run();
  return doc;
}

}  // namespace td::io::pickle
