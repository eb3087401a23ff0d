// AlignedBuffer: heap memory on a 4 KiB boundary, rounded up to whole 4 KiB blocks. O_DIRECT
// needs it for T2's payloads and headers; T2 and T3 keep KVC1 encodings in it.
//
// Ownership: the buffer owns its memory (moved, never copied). Allocation failure leaves it
// empty (check data()), never throws.
// Thread safety: none; a buffer is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <utility>

namespace kdn::sidecar {

class AlignedBuffer {
 public:
  static constexpr uint64_t kAlign = 4096;

  AlignedBuffer() = default;
  // Null on allocation failure (check data()).
  explicit AlignedBuffer(uint64_t bytes) noexcept
      : p_(bytes ? static_cast<std::byte*>(std::aligned_alloc(kAlign, round(bytes))) : nullptr),
        n_(p_ ? round(bytes) : 0) {}
  AlignedBuffer(AlignedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~AlignedBuffer() { std::free(p_); }
  std::byte* data() const noexcept { return p_; }
  uint64_t size() const noexcept { return n_; }
  void reset() noexcept { *this = AlignedBuffer(); }
  static uint64_t round(uint64_t v) noexcept { return (v + kAlign - 1) / kAlign * kAlign; }

 private:
  std::byte* p_ = nullptr;
  uint64_t n_ = 0;
};

}  // namespace kdn::sidecar
