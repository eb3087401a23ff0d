// The bytes of T2's slab files: the superblock, the slab table and the slot headers, with
// their encoders and validating decoders. docs/disk-format.md documents every byte and the
// recovery rules; this file is the one place that reads or writes them.
//
// One slab file per (disk directory, namespace): <dir>/<namespace>/slabs.kdn.
//
//   [0, 4096)                        superblock
//   [4096, data_offset)              slab table: one 16-byte entry per slab, 256 per block
//   [data_offset + s * slab_bytes)   slab s: slots of one size class, back to back
//
// A slot is a 4 KiB header followed by the stored bytes (the canonical chunk, or its KVC1
// encoding), padded to 4 KiB. Everything is little-endian and every structure carries a
// CRC32C, so a torn or stale block is recognised and skipped, never trusted.
//
// Files are untrusted input: every decoder validates before it fills its output and answers
// bad bytes with kCorrupt (or kVersion for a newer format), naming the first check that failed.
#pragma once

#include <kdn/common/model.h>
#include <kdn/common/status.h>
#include <kdn/kdn.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kdn::sidecar::disk {

static_assert(std::endian::native == std::endian::little, "slab files are little-endian");

constexpr uint64_t kBlock = 4096;     // O_DIRECT unit; headers, table blocks, alignment
constexpr uint16_t kFormatMajor = 1;  // a reader refuses other majors
constexpr uint16_t kFormatMinor = 0;  // additions that older readers may ignore
constexpr uint32_t kSlabEntryBytes = 16;
constexpr uint32_t kSlabEntriesPerBlock = uint32_t(kBlock / kSlabEntryBytes);
constexpr size_t kNameBytes = 64;         // a namespace name, NUL-padded (at most 63 bytes)
constexpr uint32_t kMaxSlabs = 1u << 24;  // a file of 16 Mi slabs is far beyond any device

// What the stored bytes of a slot are.
enum class DiskCodec : uint8_t {
  kNone = 0,      // the canonical chunk itself
  kLossless = 1,  // KVC1 lossless: bit-exact; the header keeps the original's XXH3-128
  kInt8 = 2,      // KVC1 int8 (lossy)
  kKivi4 = 3,     // KVC1 kivi4 (lossy)
};
constexpr uint8_t kMaxDiskCodec = 3;
const char* disk_codec_name(DiskCodec c) noexcept;  // "none", "lossless", "int8", "kivi4"
bool parse_disk_codec(std::string_view s, DiskCodec* out) noexcept;

// Where things are in a file of `slab_count` slabs of `slab_bytes`.
struct FileLayout {
  uint64_t slab_bytes = 0;
  uint32_t slab_count = 0;
  uint64_t table_offset = kBlock;
  uint64_t data_offset = 0;  // after the table, rounded up to a block
  uint64_t file_bytes = 0;   // data_offset + slab_count * slab_bytes

  // The layout that holds as many slabs as fit `data_bytes`. slab_bytes must be a positive
  // multiple of kBlock.
  static FileLayout for_data_bytes(uint64_t data_bytes, uint64_t slab_bytes) noexcept;
  uint64_t slab_offset(uint32_t slab) const noexcept { return data_offset + uint64_t{slab} * slab_bytes; }
  // The table block holding slab s's entry, and the entry's byte offset inside that block.
  uint64_t table_block_offset(uint32_t slab) const noexcept {
    return table_offset + uint64_t{slab / kSlabEntriesPerBlock} * kBlock;
  }
  static uint32_t entry_in_block(uint32_t slab) noexcept { return (slab % kSlabEntriesPerBlock) * kSlabEntryBytes; }
};

struct Superblock {
  uint8_t file_id[16] = {};  // random at creation; every slot header repeats it
  std::string name_space;    // the namespace the file belongs to
  uint32_t dir_index = 0;    // the directory's place in disk dirs at creation (informational)
  uint32_t dir_count = 0;
  FileLayout layout;
  uint64_t created_unix_ns = 0;
};
void encode_superblock(const Superblock& s, std::byte* block) noexcept;  // block: kBlock bytes
Status decode_superblock(const std::byte* block, Superblock* out) noexcept;

// A slab's size class, as the table records it. slot_bytes 0: never given to a class.
struct SlabEntry {
  uint64_t slot_bytes = 0;    // header + payload room; a multiple of kBlock
  bool continuation = false;  // a later slab of a slot that spans several
};
void encode_slab_entry(const SlabEntry& e, std::byte* out) noexcept;  // kSlabEntryBytes
// False for bytes that are not a valid entry (never written, torn): the slab is then read as
// unassigned, and whatever it held is not recovered.
bool decode_slab_entry(const std::byte* in, SlabEntry* out) noexcept;

struct SlotHeader {
  uint8_t file_id[16] = {};
  uint64_t slot_offset = 0;  // the file offset of this header (a header found elsewhere is stale)
  uint64_t slot_bytes = 0;   // the slab class it was written in
  kdn_key key{};
  kdn_key fingerprint{};      // the model's
  uint64_t sequence = 0;      // grows with every write to the file set; the newest copy of a key wins
  uint64_t raw_bytes = 0;     // the canonical chunk's size
  uint64_t stored_bytes = 0;  // payload bytes after the header (== raw_bytes for kNone)
  DiskCodec codec = DiskCodec::kNone;
  uint32_t payload_crc = 0;  // CRC32C of the stored bytes
  kdn_key raw_hash{};        // XXH3-128 of the canonical chunk (kLossless; zero otherwise)
  std::string name_space;
  uint64_t written_unix_ns = 0;  // informational
};
void encode_slot_header(const SlotHeader& h, std::byte* block) noexcept;  // kBlock bytes
Status decode_slot_header(const std::byte* block, SlotHeader* out) noexcept;

// The slot size for `stored` payload bytes: the header plus the payload rounded up to a block.
// With `coarse`, the payload is rounded up to the next of 8 steps per power of two (at most
// 1/8 wasted): compressed sizes vary chunk by chunk, and each distinct slot size would take
// slabs of its own.
uint64_t slot_bytes_for(uint64_t stored, bool coarse) noexcept;

// CRC32C of bytes, the checksum of every structure above and of payloads; crc32c_extend
// continues one (crc32c_extend(crc32c(a), b) == crc32c(a || b)).
uint32_t crc32c(const void* data, size_t n) noexcept;
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) noexcept;
// SlotHeader::raw_hash is chunk_codec.h's chunk_hash() of the canonical chunk.

}  // namespace kdn::sidecar::disk
