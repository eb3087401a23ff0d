#include "page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kdn::bench {

Result<PageBuffer> PageBuffer::allocate(size_t bytes, bool prefault) noexcept {
  if (bytes == 0) return Status(Code::kInvalidArgument, "empty buffer");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::from_errno("mmap buffer", errno);
  PageBuffer buffer(static_cast<std::byte*>(p), bytes);
  if (prefault) {
    // A non-zero write per page: a read would only map the shared zero page.
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    for (size_t off = 0; off < bytes; off += page) buffer.data_[off] = std::byte{1};
  }
  return buffer;
}

PageBuffer::PageBuffer(PageBuffer&& other) noexcept : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

PageBuffer& PageBuffer::operator=(PageBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

PageBuffer::~PageBuffer() { release(); }

void PageBuffer::release() noexcept {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void PageBuffer::fill_pattern(uint64_t seed) noexcept {
  uint64_t x = (seed * 0x9E3779B97F4A7C15ull) | 1;  // xorshift must not start at 0
  size_t words = size_ / sizeof(uint64_t);
  auto* w = reinterpret_cast<uint64_t*>(data_);
  for (size_t i = 0; i < words; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    w[i] = x;
  }
  for (size_t i = words * sizeof(uint64_t); i < size_; ++i) data_[i] = std::byte(i);
}

}  // namespace kdn::bench
