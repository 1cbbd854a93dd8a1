// PyTorch checkpoints (.pth / .pt) as written by torch.save since PyTorch 1.6:
// a zip of stored entries, `<prefix>/data.pkl` (the pickled object) and one
// `<prefix>/data/<key>` entry per storage. The pickle is interpreted without
// executing anything (io/pickle.h) and every tensor becomes a zero-copy host
// td::Tensor over the mapped file (several tensors may share one storage).
//
// Naming: nested dicts are flattened with '.', so {"state_dict": {"net.x": t}}
// gives "state_dict.net.x" (stripping wrapper prefixes is the model loader's
// job); list and tuple items get ".0", ".1", ... suffixes; a file holding a
// single bare tensor names it "tensor". Non-tensor leaves (int, float, bool,
// string, None, a dtype) go into TensorFile::metadata as text under their
// flattened name. Tensors keep the order of the pickle.
//
// Accepted globals: collections.OrderedDict, torch._utils._rebuild_tensor_v2 /
// _v3 / _rebuild_parameter / _rebuild_parameter_with_state, the torch.*Storage
// classes of the supported dtypes, torch.storage.UntypedStorage and the torch
// dtype objects (torch.float8_e4m3fn, ...). Anything else (os.system,
// builtins.eval, numpy.*, a model class) is a td::Error(Format) naming it.
// A legacy (torch < 1.6, non-zip) file is an error that says to re-save it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "io/tensor_file.h"

namespace td::io {

// Maps `path` and reads it. Format "pth".
TensorFile read_pth(const std::string& path);

// Reads a checkpoint held in [data, data + size); `owner` keeps those bytes
// alive and is shared by every returned tensor's storage. Used by read_pth
// and by the fuzzer. Storages whose bytes are not aligned to their element
// size (impossible in files torch writes) are copied into aligned memory.
TensorFile parse_pth(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                     const std::string& name_for_errors);

// True when the bytes start like a torch.save file (zip, or the legacy pickle
// format, so that the reader can explain the latter).
bool looks_like_pth(const uint8_t* data, size_t size);

}  // namespace td::io
