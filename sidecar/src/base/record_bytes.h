// Little-endian fields of the fixed-layout records kdnd writes to places it cannot trust (the
// disk tier's slab files, the remote tier's values): typed reads and writes at byte offsets,
// zero checks, and NUL-padded names. Header-only, so each format's library stays on its own.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

namespace kdn::sidecar::record {

template <class T>
void put(std::byte* b, size_t at, T v) noexcept {
  std::memcpy(b + at, &v, sizeof v);
}
template <class T>
T get(const std::byte* b, size_t at) noexcept {
  T v;
  std::memcpy(&v, b + at, sizeof v);
  return v;
}

// Whether bytes [from, to) are all zero.
inline bool zero_range(const std::byte* b, size_t from, size_t to) noexcept {
  for (size_t i = from; i < to; ++i)
    if (b[i] != std::byte{0}) return false;
  return true;
}

// A name in a field of `field` bytes: at most field - 1 bytes, NUL-padded.
inline void put_name(std::byte* b, size_t at, size_t field, const std::string& name) noexcept {
  std::memset(b + at, 0, field);
  std::memcpy(b + at, name.data(), std::min(name.size(), field - 1));
}
// The name in such a field, or false when it fills the field or anything follows its NUL.
inline bool get_name(const std::byte* b, size_t at, size_t field, std::string* out) noexcept {
  const char* p = reinterpret_cast<const char*>(b + at);
  const size_t n = strnlen(p, field);
  if (n == field || !zero_range(b, at + n, at + field)) return false;
  *out = std::string(p, n);
  return true;
}

}  // namespace kdn::sidecar::record
