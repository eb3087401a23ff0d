// libFuzzer harness for the disk tier's on-disk records (docs/disk-format.md): the superblock,
// slab table entries and slot headers that recovery reads back from files it cannot trust.
//
// Input: the first byte picks the record and whether the harness seals it; the rest is the
// record's bytes (a 4 KiB block, zero-padded). Every record carries a CRC32C, which random bytes
// almost never match, so by default the harness writes the magic, the format major and the CRC
// itself: the fuzzer then reaches the field checks behind them, which is where a torn or
// stale record that happens to be well sealed must still be refused. Unsealed inputs check
// that a bad CRC is refused.
//
// What must hold: every refusal says why; a record that decodes satisfies the invariants
// recovery relies on (a slot's payload fits its slot, offsets are block-aligned, the layout
// fits the file) and encodes back to exactly the bytes it was decoded from (the harness writes
// the current format minor, since a reader accepts any minor), so nothing in an accepted record
// is ignored.
#include "disk_format.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

using namespace kdn::sidecar::disk;

void require(bool ok) {
  if (!ok) std::abort();
}

constexpr size_t kCrcAt = kBlock - 4;

void seal(std::byte* b) {
  const uint32_t crc = crc32c(b, kCrcAt);
  std::memcpy(b + kCrcAt, &crc, 4);
}

void superblock(std::byte* b, bool sealed_by_harness) {
  if (sealed_by_harness) {
    std::memcpy(b, "KDNSLABF", 8);
    std::memcpy(b + 8, &kFormatMajor, 2);
    std::memcpy(b + 10, &kFormatMinor, 2);  // any minor is read; this one encodes back the same
    seal(b);
  }
  Superblock s;
  const kdn::Status st = decode_superblock(b, &s);
  if (!st.ok()) {
    require(st.what() != nullptr && *st.what() != 0);
    return;
  }
  const FileLayout& l = s.layout;
  require(l.slab_count > 0 && l.slab_bytes > 0 && l.slab_bytes % kBlock == 0);
  require(l.table_offset % kBlock == 0 && l.data_offset % kBlock == 0);
  require(l.table_offset >= kBlock && l.data_offset > l.table_offset);
  require(l.slab_offset(l.slab_count - 1) + l.slab_bytes <= l.file_bytes);
  require(l.table_block_offset(l.slab_count - 1) + kBlock <= l.data_offset);
  require(s.name_space.size() < kNameBytes);
  alignas(64) std::array<std::byte, kBlock> again{};
  encode_superblock(s, again.data());
  require(std::memcmp(again.data(), b, kBlock) == 0);
}

void slab_entry(std::byte* b, bool sealed_by_harness) {
  if (sealed_by_harness) {
    const uint16_t magic = 0x4553;
    std::memcpy(b + 10, &magic, 2);
    const uint32_t crc = crc32c(b, 12);
    std::memcpy(b + 12, &crc, 4);
  }
  SlabEntry e;
  if (!decode_slab_entry(b, &e)) return;
  require(e.slot_bytes > 0 && e.slot_bytes % kBlock == 0);
  std::array<std::byte, kSlabEntryBytes> again{};
  encode_slab_entry(e, again.data());
  require(std::memcmp(again.data(), b, kSlabEntryBytes) == 0);
}

void slot_header(std::byte* b, bool sealed_by_harness) {
  if (sealed_by_harness) {
    std::memcpy(b, "KDNSLOT1", 8);
    std::memcpy(b + 8, &kFormatMajor, 2);
    std::memcpy(b + 10, &kFormatMinor, 2);
    seal(b);
  }
  SlotHeader h;
  const kdn::Status st = decode_slot_header(b, &h);
  if (!st.ok()) {
    require(st.what() != nullptr && *st.what() != 0);
    return;
  }
  require(h.slot_offset % kBlock == 0 && h.slot_bytes % kBlock == 0 && h.slot_bytes > kBlock);
  require(h.stored_bytes > 0 && h.stored_bytes <= h.slot_bytes - kBlock);  // the payload fits its slot
  require(h.raw_bytes > 0);
  require(h.codec != DiskCodec::kNone || h.stored_bytes == h.raw_bytes);
  require(h.name_space.size() < kNameBytes);
  alignas(64) std::array<std::byte, kBlock> again{};
  encode_slot_header(h, again.data());
  require(std::memcmp(again.data(), b, kBlock) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t pick = data[0];
  alignas(64) std::array<std::byte, kBlock> block{};
  std::memcpy(block.data(), data + 1, std::min(size - 1, kBlock));
  const bool seal_it = (pick & 0x80) == 0;  // one input in two reaches the field checks
  switch (pick % 3) {
    case 0:
      superblock(block.data(), seal_it);
      break;
    case 1:
      slab_entry(block.data(), seal_it);
      break;
    default:
      slot_header(block.data(), seal_it);
      break;
  }
  return 0;
}
