// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of KVC1 headers,
// directories and layer records. Standard parameters: initial value and final xor 0xFFFFFFFF,
// so crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kdn::kernels::kvc1 {

// CRC32C of data[0, n). Uses the SSE4.2 crc32 instruction when the CPU has it.
uint32_t crc32c(const void* data, size_t n) noexcept;

// Continues a CRC: crc32c_extend(crc32c(a), b) == crc32c(a || b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) noexcept;

// The table-driven path, whatever the CPU; tests check the hardware path against it.
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n) noexcept;

}  // namespace kdn::kernels::kvc1
