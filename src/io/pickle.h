// A safe pickle reader for the subset torch.save writes (protocol 2, plus the
// opcodes of protocols 3-5 that may appear when a caller raises the protocol).
//
// Nothing is ever executed. The pickle is interpreted into a small tree of
// Values; a GLOBAL is only accepted when the caller's filter allows it, and a
// REDUCE / NEWOBJ / BUILD on it is recorded as a `Reduce` node for the caller
// to interpret (pth.cpp turns torch._utils._rebuild_tensor_v2 into a tensor).
// The one call the reader evaluates itself is collections.OrderedDict(), which
// becomes a Dict so that the SETITEMS that follow can fill it.
//
// Hostile input is bounded: stack depth, memo size, container sizes, string
// lengths and the total number of objects each have a limit, and exceeding it
// is a td::Error(Format) naming the file, the byte offset and the limit.
// Values live in an arena owned by the Document, so a pickle that builds a
// cycle (a list that contains itself) cannot leak; consumers walking the tree
// must bound their own recursion (a shared subtree may be reached many times).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace td::io::pickle {

enum class Kind : uint8_t {
  None,
  Bool,
  Int,
  Float,
  String,        // BINUNICODE*: validated UTF-8
  Bytes,         // BINBYTES*
  List,
  Tuple,
  Dict,          // {} or collections.OrderedDict(); keys in insertion order
  Global,        // a reference to module.name (never resolved to code)
  Reduce,        // callable(*args), with the BUILD state if one followed; never called
  PersistentId,  // BINPERSID: what torch uses to point at a storage entry
};
const char* kind_name(Kind k);

struct Value {
  Kind kind = Kind::None;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;    // String and Bytes contents; Global: the module
  std::string name;    // Global: the attribute name
  std::vector<const Value*> items;                              // List, Tuple
  std::vector<std::pair<const Value*, const Value*>> entries;  // Dict (duplicate keys are kept)
  const Value* callable = nullptr;  // Reduce: a Global
  const Value* args = nullptr;      // Reduce: a Tuple; PersistentId: the id object
  const Value* state = nullptr;     // Reduce: what BUILD passed, or nullptr

  bool is(Kind k) const { return kind == k; }
  // "module.name" for a Global, or the callable's for a Reduce; "" otherwise.
  std::string global_name() const;
};

// One line describing a value for error messages: "int 7", "string 'cpu'",
// "tuple of 5", "call of torch._utils._rebuild_tensor_v2", ... (never recursive).
std::string describe(const Value& v);

struct Limits {
  size_t max_stack = size_t(1) << 20;       // values + marks on the stack
  size_t max_memo = size_t(1) << 22;        // memo entries, and the largest memo index
  size_t max_container = size_t(1) << 22;   // items of one list / tuple / dict
  size_t max_string = size_t(1) << 26;      // bytes of one string or bytes object
  size_t max_objects = size_t(1) << 21;     // values created in total
};

// Decides whether GLOBAL module.name may appear. Everything else is rejected
// with an error naming module.name and the file.
using GlobalFilter = std::function<bool(std::string_view module, std::string_view name)>;

class Document {
 public:
  const Value* root() const { return root_; }
  size_t object_count() const { return arena_.size(); }

 private:
  friend Document unpickle(std::span<const uint8_t>, const GlobalFilter&, const std::string&, const Limits&);
  std::deque<Value> arena_;  // deque: stable addresses while growing
  const Value* root_ = nullptr;
};

// Interprets one pickle (up to its STOP opcode). `name_for_errors` names the
// file (and member) in every message.
Document unpickle(std::span<const uint8_t> bytes, const GlobalFilter& allow_global, const std::string& name_for_errors,
                  const Limits& limits = {});

}  // namespace td::io::pickle
