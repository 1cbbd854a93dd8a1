#include "core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <sstream>

#include "core/cuda_runtime.h"

namespace td {

std::string Device::str() const { return is_cpu() ? "cpu" : cat("cuda:", index); }

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

// ---- Storage ----------------------------------------------------------------

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  std::shared_ptr<Storage> s(new Storage());
  s->nbytes_ = nbytes;
  s->device_ = device;
  if (device.is_cpu()) {
    // 64-byte alignment for vector loads; at least 1 byte so the pointer is unique.
    const size_t n = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, n);
    if (!p) fail(ErrorKind::OutOfMemory, "host allocation of ", nbytes, " bytes failed");
    s->data_ = p;
    s->deleter_ = [](void* q) { std::free(q); };
  } else {
    s->data_ = cuda::device_alloc(nbytes, device.index);
    const int dev = device.index;
    s->deleter_ = [dev](void* q) { cuda::device_free(q, dev); };
  }
  return s;
}

std::shared_ptr<Storage> Storage::borrow(void* data, size_t nbytes, Device device,
                                         std::shared_ptr<const void> owner) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->owner_ = std::move(owner);
  return s;
}

Storage::~Storage() {
  if (deleter_ && data_) deleter_(data_);
}

// ---- Tensor -----------------------------------------------------------------

Tensor::Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, std::vector<int64_t> strides,
               size_t byte_offset)
    : storage_(std::move(storage)), dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)),
      byte_offset_(byte_offset) {
  TD_CHECK(shape_.size() == strides_.size(), Internal, "tensor shape ", shape_str(shape_), " and strides ",
           shape_str(strides_), " differ in rank");
  for (int64_t d : shape_) TD_CHECK(d >= 0, Shape, "negative dimension in shape ", shape_str(shape_));
  // The furthest element reached must lie inside the storage.
  bool empty = false;
  for (int64_t d : shape_) empty |= d == 0;
  if (!empty) {
    // Overflow-checked: hostile shapes and strides must not wrap around into range.
    int64_t max_off = 0;
    bool overflow = false;
    for (size_t i = 0; i < shape_.size(); ++i) {
      TD_CHECK(strides_[i] >= 0, Shape, "negative stride in ", shape_str(strides_));
      int64_t term = 0;
      overflow |= __builtin_mul_overflow(shape_[i] - 1, strides_[i], &term);
      overflow |= __builtin_add_overflow(max_off, term, &max_off);
    }
    uint64_t end = 0;
    overflow |= __builtin_mul_overflow(uint64_t(max_off) + 1, uint64_t(dtype_size(dtype_)), &end);
    overflow |= __builtin_add_overflow(end, uint64_t(byte_offset_), &end);
    TD_CHECK(!overflow, Shape, "tensor ", dtype_name(dtype_), shape_str(shape_), " with strides ", shape_str(strides_),
             " spans more than 2^63 bytes");
    TD_CHECK(storage_ && end <= storage_->nbytes(), Shape, "tensor ", dtype_name(dtype_), shape_str(shape_),
             " with strides ", shape_str(strides_), " at byte offset ", byte_offset_, " needs ", end,
             " bytes but its storage holds ", storage_ ? storage_->nbytes() : 0);
  }
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  uint64_t bytes = dtype_size(dtype);
  for (int64_t d : shape) {
    TD_CHECK(d >= 0, Shape, "negative dimension in shape ", shape_str(shape));
    TD_CHECK(!__builtin_mul_overflow(bytes, uint64_t(d), &bytes), Shape, "tensor of shape ", shape_str(shape),
             " has more than 2^64 bytes");
  }
  auto st = Storage::allocate(size_t(bytes), device);
  return Tensor(std::move(st), dtype, shape, contiguous_strides(shape));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) std::memset(t.raw_data(), 0, t.nbytes());
  else cuda::memset_zero(t.raw_data(), t.nbytes(), device.index);
  return t;
}

Tensor Tensor::from_f32(const Shape& shape, const std::vector<float>& values, DType dtype) {
  TD_CHECK(int64_t(values.size()) == shape_numel(shape), Shape, "from_f32: ", values.size(),
           " values for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype);
  convert_elements(values.data(), DType::F32, t.raw_data(), dtype, values.size());
  return t;
}

int64_t Tensor::size(int64_t d) const {
  if (d < 0) d += dim();
  TD_CHECK(d >= 0 && d < dim(), Shape, "dimension ", d, " out of range for ", desc());
  return shape_[size_t(d)];
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  TD_CHECK(storage_, Internal, "access to the data of an undefined tensor");
  return static_cast<uint8_t*>(storage_->data()) + byte_offset_;
}

Tensor Tensor::view(const Shape& shape) const {
  TD_CHECK(is_contiguous(), Shape, "view of non-contiguous ", desc());
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      TD_CHECK(infer < 0, Shape, "view ", shape_str(shape), ": more than one -1");
      infer = int64_t(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    TD_CHECK(known > 0 && numel() % known == 0, Shape, "cannot view ", desc(), " as ", shape_str(shape));
    s[size_t(infer)] = numel() / known;
  }
  TD_CHECK(shape_numel(s) == numel(), Shape, "cannot view ", desc(), " as ", shape_str(shape));
  return Tensor(storage_, dtype_, s, contiguous_strides(s), byte_offset_);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  TD_CHECK(int64_t(dims.size()) == dim(), Shape, "permute of ", desc(), " needs ", dim(), " dims");
  Shape s(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = dims[i] < 0 ? dims[i] + dim() : dims[i];
    TD_CHECK(d >= 0 && d < dim() && !seen[size_t(d)], Shape, "permute: bad dims ", shape_str(dims));
    seen[size_t(d)] = true;
    s[i] = shape_[size_t(d)];
    st[i] = strides_[size_t(d)];
  }
  return Tensor(storage_, dtype_, s, st, byte_offset_);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end) const {
  if (d < 0) d += dim();
  TD_CHECK(d >= 0 && d < dim(), Shape, "slice dimension ", d, " out of range for ", desc());
  TD_CHECK(0 <= start && start <= end && end <= shape_[size_t(d)], Shape, "slice [", start, ", ", end,
           ") out of range for dim ", d, " of ", desc());
  Shape s = shape_;
  s[size_t(d)] = end - start;
  return Tensor(storage_, dtype_, s, strides_,
                byte_offset_ + size_t(start * strides_[size_t(d)]) * dtype_size(dtype_));
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  if (d < 0) d += dim();
  Tensor t = slice(d, index, index + 1);
  Shape s = t.shape_, st = t.strides_;
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return Tensor(storage_, dtype_, s, st, t.byte_offset_);
}

// Walks every element of a strided tensor in row-major order, calling f(byte offset from data()).
template <typename F>
static void for_each_offset(const Shape& shape, const std::vector<int64_t>& strides, size_t esize, F&& f) {
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (size_t k = 0; k < shape.size(); ++k) off += idx[k] * strides[k];
    f(size_t(off) * esize);
    for (size_t k = shape.size(); k-- > 0;) {
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
  }
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  TD_CHECK(device().is_cpu(), Unsupported, "contiguous() of a strided CUDA tensor: use ops::copy");
  Tensor out = empty(shape_, dtype_);
  const size_t es = dtype_size(dtype_);
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  const auto* src = static_cast<const uint8_t*>(raw_data());
  for_each_offset(shape_, strides_, es, [&](size_t off) {
    std::memcpy(dst, src + off, es);
    dst += es;
  });
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  TD_CHECK(device().is_cpu(), Unsupported, "Tensor::to(dtype) on ", device().str(),
           ": device conversion is an op (ops::cast)");
  Tensor src = contiguous();
  Tensor out = empty(shape_, dtype);
  convert_elements(src.raw_data(), dtype_, out.raw_data(), dtype, size_t(numel()));
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  TD_CHECK(this->device().is_cpu() || device.is_cpu(), Unsupported, "copy between two CUDA devices");
  Tensor src = this->device().is_cpu() ? contiguous() : *this;
  TD_CHECK(src.is_contiguous(), Unsupported, "copy of a strided CUDA tensor to the host");
  Tensor out = empty(shape_, dtype_, device);
  cuda::memcpy_sync(out.raw_data(), src.raw_data(), nbytes(), device.is_cuda());
  return out;
}

Tensor Tensor::clone() const {
  if (device().is_cpu()) {
    Tensor c = contiguous();
    if (c.storage_ != storage_ || c.byte_offset_ != byte_offset_) return c;
    Tensor out = empty(shape_, dtype_);
    std::memcpy(out.raw_data(), raw_data(), nbytes());
    return out;
  }
  TD_CHECK(is_contiguous(), Unsupported, "clone of a strided CUDA tensor");
  Tensor out = empty(shape_, dtype_, device());
  cuda::memcpy_d2d(out.raw_data(), raw_data(), nbytes(), device().index);
  return out;
}

void Tensor::copy_(const Tensor& src) {
  TD_CHECK(src.shape_ == shape_, Shape, "copy_ from ", src.desc(), " into ", desc());
  if (device().is_cpu() && src.device().is_cpu()) {
    Tensor s = src.contiguous().to(dtype_);
    const size_t es = dtype_size(dtype_);
    const auto* p = static_cast<const uint8_t*>(s.raw_data());
    auto* base = static_cast<uint8_t*>(raw_data());
    for_each_offset(shape_, strides_, es, [&](size_t off) {
      std::memcpy(base + off, p, es);
      p += es;
    });
    return;
  }
  TD_CHECK(src.dtype_ == dtype_ && is_contiguous() && src.is_contiguous(), Unsupported,
           "copy_ across devices needs equal dtypes and contiguous tensors: ", src.desc(), " -> ", desc());
  if (device().is_cuda() && src.device().is_cuda())
    cuda::memcpy_d2d(raw_data(), src.raw_data(), nbytes(), device().index);
  else
    cuda::memcpy_sync(raw_data(), src.raw_data(), nbytes(), device().is_cuda());
}

double Tensor::item_f64(int64_t flat) const {
  TD_CHECK(device().is_cpu(), Unsupported, "item_f64 on ", device().str());
  TD_CHECK(flat >= 0 && flat < numel(), Shape, "element ", flat, " out of range for ", desc());
  int64_t off = 0, rem = flat;
  for (size_t k = shape_.size(); k-- > 0;) {
    off += (rem % shape_[k]) * strides_[k];
    rem /= shape_[k];
  }
  return load_as_f64(raw_data(), dtype_, size_t(off));
}

std::vector<float> Tensor::to_f32_vector() const {
  Tensor h = device().is_cpu() ? *this : to(Device::cpu());
  Tensor f = h.contiguous().to(DType::F32);
  const float* p = f.data<float>();
  return std::vector<float>(p, p + f.numel());
}

std::string Tensor::desc() const {
  if (!defined()) return "undefined tensor";
  return cat(dtype_name(dtype_), shape_str(shape_), " ", device().str());
}

}  // namespace td
