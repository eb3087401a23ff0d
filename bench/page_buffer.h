// Page-aligned anonymous memory for copy benchmarks. Pre-faulting touches every page up
// front so that page faults never land inside a timed copy (they would time the kernel's
// page allocator, not the memory system).
//
// Ownership: a PageBuffer owns its mapping and unmaps it on destruction. Not thread-safe to
// move while another thread uses it; concurrent reads and writes of disjoint ranges are fine.
#pragma once

#include <kdn/common/status.h>

#include <cstddef>
#include <cstdint>

namespace kdn::bench {

class PageBuffer {
 public:
  // Maps `bytes` (> 0) of private anonymous memory; with `prefault`, writes every page.
  static Result<PageBuffer> allocate(size_t bytes, bool prefault) noexcept;

  PageBuffer() = default;
  PageBuffer(PageBuffer&& other) noexcept;
  PageBuffer& operator=(PageBuffer&& other) noexcept;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  ~PageBuffer();

  std::byte* data() noexcept { return data_; }
  const std::byte* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }

  // Fills the buffer with a byte pattern derived from `seed` (deterministic, not all equal).
  void fill_pattern(uint64_t seed) noexcept;

 private:
  PageBuffer(std::byte* data, size_t size) noexcept : data_(data), size_(size) {}
  void release() noexcept;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kdn::bench
