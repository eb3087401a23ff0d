// DiskTier's private parts, shared by disk_tier.cc (transfers, space, background work) and
// disk_tier_open.cc (files and recovery). Not for use outside those two files.
#pragma once

#include "aligned_buffer.h"
#include "disk/disk_tier.h"
#include "worker_pool.h"

#include <kdn/kernels/codec.h>

namespace kdn::sidecar {

static_assert(disk::kBlock == AlignedBuffer::kAlign, "O_DIRECT buffers are block-aligned");

struct DiskTier::Device {
  uint32_t index = 0;
  std::string dir;       // <disk dir>/<namespace>
  std::string path;      // the slab file
  ipc::UniqueFd dir_fd;  // <disk dir>/<namespace>, checked: the slab file is opened under it
  ipc::UniqueFd fd;
  disk::Superblock super;
  std::unique_ptr<SlabAllocator> alloc;  // over the data area: offsets are data-relative
  AlignedBuffer table;                   // the slab table as on disk
  std::vector<uint8_t> table_writing;    // per table block: a write in flight
  std::vector<uint8_t> table_dirty;      // ... and a newer state waits for it
  std::unique_ptr<DiskRing> ring;
  bool dirty = false;    // writes completed since the last fdatasync was submitted
  bool syncing = false;  // an fdatasync in flight
};

struct DiskTier::Slot {
  bool live = false;               // a placement the index holds
  bool placed = false;             // a physical slot is held
  bool written = false;            // payload and header are on the device
  bool pending_reencode = false;   // written raw under a codec: the background pass re-encodes it
  bool release_when_idle = false;  // the index let go while an operation still touched it
  bool clear_when_idle = false;    // ... and its header must be erased first
  uint32_t device = 0;
  uint16_t dev_class = 0;   // the device allocator's class
  uint16_t tier_class = 0;  // the tier's class (by raw size; eviction queues)
  uint64_t offset = 0;      // in the device's data area
  uint64_t slot_bytes = 0;
  uint64_t raw_bytes = 0, stored_bytes = 0;
  uint32_t crc = 0;
  disk::DiskCodec codec = disk::DiskCodec::kNone;
  kdn_key raw_hash{}, key{}, fingerprint{};
  uint64_t sequence = 0;
  uint32_t busy = 0;  // operations reading its physical slot
};

struct DiskTier::Op {
  enum Kind : int { kRead, kWrite, kTable, kClear, kSync, kReencode };
  int kind = kRead;
  bool transfer = false;  // one of the index's transfers (completes through reap)
  TransferId id = 0;
  uint32_t handle = 0;
  uint32_t device = 0;
  int stage = 0;              // write: 0 payload, 1 header; re-encode: 0 reading, 1 encoding,
                              // 2 payload, 3 header
  std::byte* host = nullptr;  // transfer: arena memory
  uint64_t bytes = 0;         // raw bytes
  ChunkIdentity chunk;
  IoRequest io[2];
  uint32_t pending = 0;   // I/Os outstanding
  int32_t error = 0;      // the first I/O error (-errno)
  AlignedBuffer payload;  // encoded bytes, a table block, or a zero block
  std::byte* header = nullptr;
  bool header_pooled = false;
  // What a worker found or made.
  Status status;
  bool encode_job = false;    // a write went to an encoder (counted in encoding_)
  bool payload_done = false;  // a write's payload landed (its header goes only after it)
  bool crc_done = false;      // ... and its CRC is known
  bool encoded = false;       // a write's payload is `payload` (KVC1), not the host bytes
  bool mark_pending = false;  // written raw under a codec: re-encode later
  disk::DiskCodec codec = disk::DiskCodec::kNone;
  uint64_t stored = 0;
  uint32_t crc = 0;
  uint64_t crc_done_bytes = 0;  // of a checksum computed on the loop in slices
  kdn_key raw_hash{};
  kernels::ChunkGeometry geometry;
  bool has_geometry = false;
  // What a worker checks a read against (copied from the slot: workers never touch slots_).
  uint32_t want_crc = 0;
  disk::DiskCodec want_codec = disk::DiskCodec::kNone;
  kdn_key want_hash{}, want_fingerprint{};
  // Re-encode: the new physical slot.
  Slot target;
  uint64_t sequence_at_start = 0;
  uint32_t table_block = 0;
};

namespace disk_detail {
uint64_t now_unix_ns() noexcept;
}  // namespace disk_detail

}  // namespace kdn::sidecar
