// CRC32C (Castagnoli), for components outside the codec that checksum bytes the same way KVC1
// does: T2's slab files (sidecar/src/base/disk_format.h). Implemented in kernels/codec/crc32c.cc
// (target kdn_codec); see its private header for the parameters. Reentrant.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kdn::kernels::kvc1 {

// CRC32C of data[0, n), standard parameters: crc32c("123456789") == 0xE3069283. Uses the SSE4.2
// crc32 instruction when the CPU has it.
uint32_t crc32c(const void* data, size_t n) noexcept;
// Continues a CRC: crc32c_extend(crc32c(a), b) == crc32c(a || b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) noexcept;

}  // namespace kdn::kernels::kvc1
