// Tensor: a strided view (shape, strides in elements, byte offset, dtype) over
// shared Storage on one device. Storage is host memory (owned, or borrowed from
// an mmap'd file and kept alive by a holder) or CUDA device memory from the
// stream-ordered allocator.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace td {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  std::string str() const;
};

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

// A block of memory on one device. The deleter (or `owner`) frees it.
class Storage {
 public:
  // Allocates nbytes on `device` (CUDA memory comes from the stream-ordered pool).
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device);
  // Wraps memory owned by someone else; `owner` keeps it alive (e.g. a file mapping).
  static std::shared_ptr<Storage> borrow(void* data, size_t nbytes, Device device,
                                         std::shared_ptr<const void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::shared_ptr<const void> owner_;
  std::function<void(void*)> deleter_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor
  Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, std::vector<int64_t> strides,
         size_t byte_offset = 0);

  // Fresh, uninitialised, contiguous.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // Host tensor filled from values (converted to dtype).
  static Tensor from_f32(const Shape& shape, const std::vector<float>& values, DType dtype = DType::F32);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  size_t byte_offset() const { return byte_offset_; }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw_data() const;
  template <typename T>
  T* data() const { return static_cast<T*>(raw_data()); }

  // Views (share storage).
  Tensor view(const Shape& shape) const;  // requires contiguous; one dim may be -1
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end) const;
  Tensor select(int64_t dim, int64_t index) const;

  // Copies.
  Tensor contiguous() const;
  Tensor to(DType dtype) const;     // host only; device conversion lives in ops
  Tensor to(Device device) const;   // copies between host and CUDA (contiguous result)
  Tensor clone() const;
  // Copies src into this tensor (same shape; dtype converted on the host).
  void copy_(const Tensor& src);

  // Host-side element access through f64 (tests, references, readers; not a hot path).
  double item_f64(int64_t flat_index) const;
  std::vector<float> to_f32_vector() const;

  std::string desc() const;  // "bf16[2, 3] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::F32;
  Shape shape_;
  std::vector<int64_t> strides_;
  size_t byte_offset_ = 0;
};

}  // namespace td
