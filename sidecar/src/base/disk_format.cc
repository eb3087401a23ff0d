#include "disk_format.h"

#include "record_bytes.h"

#include <kdn/kernels/crc32c.h>

#include <cstring>

namespace kdn::sidecar::disk {
namespace {

constexpr char kSuperMagic[8] = {'K', 'D', 'N', 'S', 'L', 'A', 'B', 'F'};
constexpr char kSlotMagic[8] = {'K', 'D', 'N', 'S', 'L', 'O', 'T', '1'};
constexpr uint16_t kEntryMagic = 0x4553;  // "SE"
constexpr size_t kCrcAt = kBlock - 4;     // every block's CRC32C covers [0, kCrcAt)
// No slab file is larger (64 PiB): a superblock claiming more is damaged, and its offsets would
// overflow.
constexpr uint64_t kMaxFileBytes = uint64_t{1} << 56;

using record::get;
using record::put;

void put_name(std::byte* b, size_t at, const std::string& name) noexcept { record::put_name(b, at, kNameBytes, name); }
bool get_name(const std::byte* b, size_t at, std::string* out) noexcept {
  return record::get_name(b, at, kNameBytes, out);
}
bool zero_from(const std::byte* b, size_t from, size_t to) noexcept { return record::zero_range(b, from, to); }

void seal(std::byte* block) noexcept { put<uint32_t>(block, kCrcAt, crc32c(block, kCrcAt)); }
bool sealed(const std::byte* block) noexcept { return get<uint32_t>(block, kCrcAt) == crc32c(block, kCrcAt); }

uint64_t round_up(uint64_t v, uint64_t a) noexcept { return (v + a - 1) / a * a; }

}  // namespace

const char* disk_codec_name(DiskCodec c) noexcept {
  switch (c) {
    case DiskCodec::kNone:
      return "none";
    case DiskCodec::kLossless:
      return "lossless";
    case DiskCodec::kInt8:
      return "int8";
    case DiskCodec::kKivi4:
      return "kivi4";
  }
  return "unknown";
}

bool parse_disk_codec(std::string_view s, DiskCodec* out) noexcept {
  for (uint8_t c = 0; c <= kMaxDiskCodec; ++c) {
    if (s == disk_codec_name(DiskCodec(c))) {
      *out = DiskCodec(c);
      return true;
    }
  }
  return false;
}

uint32_t crc32c(const void* data, size_t n) noexcept { return kernels::kvc1::crc32c(data, n); }
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) noexcept {
  return kernels::kvc1::crc32c_extend(crc, data, n);
}

FileLayout FileLayout::for_data_bytes(uint64_t data_bytes, uint64_t slab_bytes) noexcept {
  FileLayout l;
  l.slab_bytes = slab_bytes;
  const uint64_t slabs = slab_bytes ? data_bytes / slab_bytes : 0;
  l.slab_count = uint32_t(slabs < kMaxSlabs ? slabs : kMaxSlabs);
  const uint64_t table_blocks = (uint64_t{l.slab_count} + kSlabEntriesPerBlock - 1) / kSlabEntriesPerBlock;
  l.table_offset = kBlock;
  l.data_offset = l.table_offset + (table_blocks ? table_blocks : 1) * kBlock;
  l.file_bytes = l.data_offset + uint64_t{l.slab_count} * slab_bytes;
  return l;
}

uint64_t slot_bytes_for(uint64_t stored, bool coarse) noexcept {
  uint64_t payload = round_up(stored ? stored : 1, kBlock);
  if (coarse && payload > 8 * kBlock) {
    // 8 steps per power of two: the step is 1/8 of the highest power of two below the size.
    const uint64_t top = uint64_t{1} << (63 - std::countl_zero(payload));
    payload = round_up(payload, top / 8);
  }
  return kBlock + payload;
}

// ---- superblock ----------------------------------------------------------------------------------
//
//   0 magic "KDNSLABF"   8 u16 major   10 u16 minor   12 u32 block bytes (4096)
//  16 file_id[16]        32 namespace[64]             96 u32 dir_index   100 u32 dir_count
// 104 u64 slab_bytes    112 u32 slab_count  116 u32 0  120 u64 table_offset
// 128 u64 data_offset   136 u64 file_bytes            144 u64 created_unix_ns
// 152..4092 zero        4092 u32 CRC32C of [0, 4092)

void encode_superblock(const Superblock& s, std::byte* b) noexcept {
  std::memset(b, 0, kBlock);
  std::memcpy(b, kSuperMagic, 8);
  put<uint16_t>(b, 8, kFormatMajor);
  put<uint16_t>(b, 10, kFormatMinor);
  put<uint32_t>(b, 12, uint32_t(kBlock));
  std::memcpy(b + 16, s.file_id, 16);
  put_name(b, 32, s.name_space);
  put<uint32_t>(b, 96, s.dir_index);
  put<uint32_t>(b, 100, s.dir_count);
  put<uint64_t>(b, 104, s.layout.slab_bytes);
  put<uint32_t>(b, 112, s.layout.slab_count);
  put<uint64_t>(b, 120, s.layout.table_offset);
  put<uint64_t>(b, 128, s.layout.data_offset);
  put<uint64_t>(b, 136, s.layout.file_bytes);
  put<uint64_t>(b, 144, s.created_unix_ns);
  seal(b);
}

Status decode_superblock(const std::byte* b, Superblock* out) noexcept {
  if (std::memcmp(b, kSuperMagic, 8) != 0) return Status(Code::kCorrupt, "not a kdn slab file (bad magic)");
  if (get<uint16_t>(b, 8) != kFormatMajor) return Status(Code::kVersion, "slab file of another format major");
  if (!sealed(b)) return Status(Code::kCorrupt, "superblock CRC mismatch");
  if (get<uint32_t>(b, 12) != kBlock) return Status(Code::kCorrupt, "superblock block size is not 4096");
  Superblock s;
  std::memcpy(s.file_id, b + 16, 16);
  if (!get_name(b, 32, &s.name_space)) return Status(Code::kCorrupt, "superblock namespace is not a name");
  s.dir_index = get<uint32_t>(b, 96);
  s.dir_count = get<uint32_t>(b, 100);
  const uint64_t slab_bytes = get<uint64_t>(b, 104);
  const uint32_t slabs = get<uint32_t>(b, 112);
  uint64_t data_bytes = 0;
  if (slab_bytes == 0 || slab_bytes % kBlock != 0 || slabs == 0 || slabs > kMaxSlabs || get<uint32_t>(b, 116) != 0 ||
      __builtin_mul_overflow(uint64_t{slabs}, slab_bytes, &data_bytes) || data_bytes > kMaxFileBytes)
    return Status(Code::kCorrupt, "superblock slab geometry is impossible");
  s.layout = FileLayout::for_data_bytes(data_bytes, slab_bytes);
  if (s.layout.slab_count != slabs || get<uint64_t>(b, 120) != s.layout.table_offset ||
      get<uint64_t>(b, 128) != s.layout.data_offset || get<uint64_t>(b, 136) != s.layout.file_bytes)
    return Status(Code::kCorrupt, "superblock offsets disagree with its slab geometry");
  s.created_unix_ns = get<uint64_t>(b, 144);
  if (!zero_from(b, 152, kCrcAt)) return Status(Code::kCorrupt, "superblock reserved bytes are not zero");
  *out = std::move(s);
  return OkStatus();
}

// ---- slab table entries ----------------------------------------------------------------------------
//
//   0 u64 slot_bytes   8 u16 flags (bit 0: continuation)   10 u16 magic 0x4553   12 u32 CRC32C of [0, 12)

void encode_slab_entry(const SlabEntry& e, std::byte* b) noexcept {
  put<uint64_t>(b, 0, e.slot_bytes);
  put<uint16_t>(b, 8, e.continuation ? 1 : 0);
  put<uint16_t>(b, 10, kEntryMagic);
  put<uint32_t>(b, 12, crc32c(b, 12));
}

bool decode_slab_entry(const std::byte* b, SlabEntry* out) noexcept {
  if (get<uint16_t>(b, 10) != kEntryMagic || get<uint32_t>(b, 12) != crc32c(b, 12)) return false;
  const uint64_t slot = get<uint64_t>(b, 0);
  const uint16_t flags = get<uint16_t>(b, 8);
  if (slot == 0 || slot % kBlock != 0 || (flags & ~1u) != 0) return false;
  *out = SlabEntry{slot, (flags & 1u) != 0};
  return true;
}

// ---- slot headers -----------------------------------------------------------------------------------
//
//   0 magic "KDNSLOT1"  8 u16 major  10 u16 minor  12 u32 flags (0)  16 file_id[16]
//  32 u64 slot_offset  40 u64 slot_bytes  48 key (lo, hi)  64 fingerprint (lo, hi)
//  80 u64 sequence     88 u64 raw_bytes   96 u64 stored_bytes
// 104 u8 codec  105 u8[3] zero  108 u32 payload CRC32C  112 raw_hash (lo, hi)
// 128 namespace[64]   192 u64 written_unix_ns   200..4092 zero   4092 u32 CRC32C of [0, 4092)

void encode_slot_header(const SlotHeader& h, std::byte* b) noexcept {
  std::memset(b, 0, kBlock);
  std::memcpy(b, kSlotMagic, 8);
  put<uint16_t>(b, 8, kFormatMajor);
  put<uint16_t>(b, 10, kFormatMinor);
  std::memcpy(b + 16, h.file_id, 16);
  put<uint64_t>(b, 32, h.slot_offset);
  put<uint64_t>(b, 40, h.slot_bytes);
  put<kdn_key>(b, 48, h.key);
  put<kdn_key>(b, 64, h.fingerprint);
  put<uint64_t>(b, 80, h.sequence);
  put<uint64_t>(b, 88, h.raw_bytes);
  put<uint64_t>(b, 96, h.stored_bytes);
  put<uint8_t>(b, 104, uint8_t(h.codec));
  put<uint32_t>(b, 108, h.payload_crc);
  put<kdn_key>(b, 112, h.raw_hash);
  put_name(b, 128, h.name_space);
  put<uint64_t>(b, 192, h.written_unix_ns);
  seal(b);
}

Status decode_slot_header(const std::byte* b, SlotHeader* out) noexcept {
  if (std::memcmp(b, kSlotMagic, 8) != 0) return Status(Code::kCorrupt, "no slot header here");
  if (get<uint16_t>(b, 8) != kFormatMajor) return Status(Code::kVersion, "slot header of another format major");
  if (!sealed(b)) return Status(Code::kCorrupt, "slot header CRC mismatch");
  if (get<uint32_t>(b, 12) != 0 || !zero_from(b, 105, 108) || !zero_from(b, 200, kCrcAt))
    return Status(Code::kCorrupt, "slot header reserved bytes are not zero");
  SlotHeader h;
  std::memcpy(h.file_id, b + 16, 16);
  h.slot_offset = get<uint64_t>(b, 32);
  h.slot_bytes = get<uint64_t>(b, 40);
  h.key = get<kdn_key>(b, 48);
  h.fingerprint = get<kdn_key>(b, 64);
  h.sequence = get<uint64_t>(b, 80);
  h.raw_bytes = get<uint64_t>(b, 88);
  h.stored_bytes = get<uint64_t>(b, 96);
  const uint8_t codec = get<uint8_t>(b, 104);
  h.payload_crc = get<uint32_t>(b, 108);
  h.raw_hash = get<kdn_key>(b, 112);
  h.written_unix_ns = get<uint64_t>(b, 192);
  if (!get_name(b, 128, &h.name_space)) return Status(Code::kCorrupt, "slot header namespace is not a name");
  if (codec > kMaxDiskCodec) return Status(Code::kCorrupt, "slot header names an unknown codec");
  h.codec = DiskCodec(codec);
  if (h.slot_offset % kBlock != 0 || h.slot_bytes % kBlock != 0 || h.slot_bytes <= kBlock)
    return Status(Code::kCorrupt, "slot header place or size is not block-aligned");
  if (h.raw_bytes == 0 || h.raw_bytes > kMaxChunkBytes)
    return Status(Code::kCorrupt, "slot header raw size is impossible");
  if (h.stored_bytes == 0 || h.stored_bytes > h.slot_bytes - kBlock)
    return Status(Code::kCorrupt, "slot header stored size does not fit its slot");
  if (h.codec == DiskCodec::kNone && h.stored_bytes != h.raw_bytes)
    return Status(Code::kCorrupt, "an uncompressed slot's stored size differs from its raw size");
  *out = std::move(h);
  return OkStatus();
}

}  // namespace kdn::sidecar::disk
