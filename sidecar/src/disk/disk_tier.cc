// DiskTier: space, transfers and background work. Files and recovery: disk_tier_open.cc.
#include "disk/disk_tier_internal.h"

#include <kdn/common/clock.h>

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

namespace kdn::sidecar {

using disk::DiskCodec;
using disk::kBlock;

namespace {

constexpr uint32_t kDegradeAfter = 8;           // consecutive failed writes
constexpr uint64_t kDegradeNs = 5'000'000'000;  // ... refuse new ones this long
constexpr uint64_t round_block(uint64_t v) { return (v + kBlock - 1) / kBlock * kBlock; }

}  // namespace

namespace disk_detail {

uint64_t now_unix_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

}  // namespace disk_detail

// ---- construction ----------------------------------------------------------------------------------

DiskTier::DiskTier(const DiskTierOptions& options, DiskIo& io) : options_(options), io_(io) {}

DiskTier::~DiskTier() {
  drain();
  workers_.reset();
  for (auto& d : devices_) d->ring.reset();  // before the header pool they may still name
  std::free(header_pool_);
  std::free(zero_block_);
}

uint64_t DiskTier::capacity_bytes() const noexcept {
  uint64_t c = 0;
  for (const auto& d : devices_) c += d->alloc->capacity();
  return c;
}

uint64_t DiskTier::used_bytes() const noexcept {
  uint64_t u = 0;
  for (const auto& d : devices_) u += d->alloc->used_bytes();
  return u;
}

RingCounters DiskTier::ring_counters() const noexcept {
  RingCounters sum;
  for (const auto& d : devices_) {
    const RingCounters& c = d->ring->counters();
    sum.submitted += c.submitted;
    sum.completed += c.completed;
    sum.retries += c.retries;
    sum.short_transfers += c.short_transfers;
    sum.fixed += c.fixed;
    sum.unfixed += c.unfixed;
    sum.queued_max = std::max(sum.queued_max, c.queued_max);
  }
  return sum;
}

bool DiskTier::degraded() const noexcept { return now_ns() < degraded_until_ns_; }

const std::string& DiskTier::file_path(uint32_t d) const noexcept { return devices_[d]->path; }

uint64_t DiskTier::file_offset(const Slot& s) const noexcept {
  return devices_[s.device]->super.layout.data_offset + s.offset;
}

bool DiskTier::locate(const Placement& p, uint32_t* device, uint64_t* header_offset, uint64_t* stored) const noexcept {
  if (p.offset >= slots_.size()) return false;
  const Slot& s = slots_[p.offset];
  if (!s.live || !s.written) return false;
  *device = s.device;
  *header_offset = file_offset(s);
  *stored = s.stored_bytes;
  return true;
}

// ---- space -------------------------------------------------------------------------------------------

Result<uint16_t> DiskTier::slot_class(uint64_t bytes) noexcept {
  if (bytes == 0) return Status(Code::kInvalidArgument, "empty chunk");
  for (size_t i = 0; i < tier_classes_.size(); ++i)
    if (tier_classes_[i] == bytes) return uint16_t(i);
  const uint64_t need = disk::slot_bytes_for(bytes, false);
  bool fits = false;
  for (const auto& d : devices_) fits |= need <= d->alloc->capacity();
  if (!fits) return Status(Code::kInvalidArgument, "chunk larger than a disk directory's slab file");
  if (tier_classes_.size() >= 255) return Status(Code::kLimit, "the disk tier has 255 chunk sizes already");
  try {
    tier_classes_.push_back(bytes);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "disk tier class table");
  }
  return uint16_t(tier_classes_.size() - 1);
}

Result<uint32_t> DiskTier::new_handle() noexcept {
  try {
    if (!free_handles_.empty()) {
      const uint32_t h = free_handles_.back();
      free_handles_.pop_back();
      return h;
    }
    free_handles_.reserve(slots_.size() + 1);  // release_handle never allocates
    slots_.emplace_back();
    return uint32_t(slots_.size() - 1);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "disk tier slot table");
  }
}

void DiskTier::release_handle(uint32_t h) noexcept {
  slots_[h] = Slot{};
  free_handles_.push_back(h);
}

void DiskTier::note_slab_taken(uint32_t d, uint64_t offset, uint64_t slot_bytes) noexcept {
  Device& dev = *devices_[d];
  const uint64_t slab_bytes = dev.super.layout.slab_bytes;
  const uint32_t first = uint32_t(offset / slab_bytes);
  const uint32_t n = slot_bytes > slab_bytes ? uint32_t((slot_bytes + slab_bytes - 1) / slab_bytes) : 1;
  uint32_t last_block = UINT32_MAX;
  for (uint32_t s = first; s < first + n; ++s) {
    const uint64_t at =
        dev.super.layout.table_block_offset(s) - dev.super.layout.table_offset + disk::FileLayout::entry_in_block(s);
    disk::encode_slab_entry(disk::SlabEntry{slot_bytes, s != first}, dev.table.data() + at);
    const uint32_t block = s / disk::kSlabEntriesPerBlock;
    if (block != last_block) write_table_block(d, block);
    last_block = block;
  }
}

bool DiskTier::place(Slot& s, uint64_t slot_bytes, uint32_t prefer) noexcept {
  const uint32_t n = uint32_t(devices_.size());
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t d = (prefer + k) % n;
    SlabAllocator& a = *devices_[d]->alloc;
    auto cls = a.class_for(slot_bytes);
    if (!cls) continue;
    const uint32_t free_before = a.free_slabs();
    auto off = a.alloc(*cls);
    if (!off) continue;
    if (a.free_slabs() < free_before) note_slab_taken(d, *off, a.slot_bytes(*cls));
    s.device = d;
    s.dev_class = *cls;
    s.offset = *off;
    s.slot_bytes = a.slot_bytes(*cls);
    s.placed = true;
    return true;
  }
  return false;
}

void DiskTier::release_physical(Slot& s) noexcept {
  if (!s.placed) return;
  devices_[s.device]->alloc->free(s.dev_class, s.offset);
  s.placed = false;
  s.written = false;
  if (s.pending_reencode) {
    s.pending_reencode = false;
    --pending_reencode_;
  }
}

Result<Placement> DiskTier::allocate(uint64_t bytes) noexcept {
  if (now_ns() < degraded_until_ns_) return Status(Code::kIo, "disk tier refusing writes after repeated failures");
  auto cls = slot_class(bytes);
  if (!cls.ok()) return cls.status();
  auto h = new_handle();
  if (!h.ok()) return h.status();
  Slot& s = slots_[*h];
  s.live = true;
  s.tier_class = *cls;
  s.raw_bytes = bytes;
  if (!place(s, disk::slot_bytes_for(bytes, false), next_device_)) {
    release_handle(*h);
    return Status(Code::kNoSpace, "disk tier has no free slot of this size");
  }
  next_device_ = (s.device + 1) % uint32_t(devices_.size());  // the next chunk goes to the next directory
  return Placement{*h, bytes, *cls};
}

void DiskTier::free(const Placement& p) noexcept {
  if (p.offset >= slots_.size() || !slots_[p.offset].live) return;
  Slot& s = slots_[p.offset];
  s.live = false;
  if (s.busy > 0) {
    s.release_when_idle = true;
    return;
  }
  release_physical(s);
  release_handle(uint32_t(p.offset));
}

void DiskTier::discard(const Placement& p) noexcept {
  if (p.offset >= slots_.size() || !slots_[p.offset].live) return;
  Slot& s = slots_[p.offset];
  if (!s.written) return free(p);
  s.live = false;
  s.clear_when_idle = true;
  if (s.busy > 0) {
    s.release_when_idle = true;
    return;
  }
  clear_header(uint32_t(p.offset));
}

void DiskTier::idle_slot_done(uint32_t h) noexcept {
  Slot& s = slots_[h];
  if (s.busy > 0 || !s.release_when_idle) return;
  s.release_when_idle = false;
  if (s.clear_when_idle && s.written) return clear_header(h);
  release_physical(s);
  release_handle(h);
}

// ---- operations ----------------------------------------------------------------------------------------

DiskTier::Op* DiskTier::new_op(int kind) noexcept {
  Op* op = new (std::nothrow) Op();
  if (op == nullptr) return nullptr;
  op->kind = kind;
  try {
    ops_.insert(op);
  } catch (const std::bad_alloc&) {
    delete op;
    return nullptr;
  }
  if (kind != Op::kRead && kind != Op::kWrite) ++background_ops_;
  return op;
}

void DiskTier::finish_op(Op* op) noexcept {
  if (op->header) return_header_block(op->header);
  if (!op->transfer && op->kind != Op::kRead && op->kind != Op::kWrite) --background_ops_;
  ops_.erase(op);
  delete op;
}

std::byte* DiskTier::header_block() noexcept {
  if (!header_free_.empty()) {
    std::byte* b = header_free_.back();
    header_free_.pop_back();
    return b;
  }
  return static_cast<std::byte*>(std::aligned_alloc(kBlock, kBlock));
}

void DiskTier::return_header_block(std::byte* b) noexcept {
  const bool pooled = header_pool_ && b >= header_pool_ && b < header_pool_ + header_pool_blocks_ * kBlock;
  if (pooled)
    header_free_.push_back(b);  // capacity reserved for the whole pool
  else
    std::free(b);
}

void DiskTier::start_io(Op* op, uint32_t device, IoRequest& io) noexcept {
  io.owner = reinterpret_cast<uint64_t>(op);
  io.file = 0;
  ++op->pending;
  devices_[device]->ring->submit(&io);
}

void DiskTier::on_io(IoRequest* io) noexcept {
  Op* op = reinterpret_cast<Op*>(io->owner);
  if (io->result < 0 && op->error == 0) op->error = io->result;
  if (io->short_count) counters_.short_transfers += io->short_count;
  if (io->retries) counters_.retries += io->retries;
  if (--op->pending > 0) return;
  switch (op->kind) {
    case Op::kWrite:
      if (op->stage == 0) {
        op->payload_done = true;
        return maybe_write_header(op);
      }
      return on_write_done(op);
    case Op::kRead:
      return on_read_done(op);
    case Op::kReencode:
      if (op->stage == 0) return on_reencode_read(op);
      if (op->stage == 2) {
        op->payload_done = true;
        return maybe_write_header(op);
      }
      return on_reencode_written(op);
    case Op::kTable: {
      Device& d = *devices_[op->device];
      ++counters_.table_writes;
      d.table_writing[op->table_block] = 0;
      if (op->error) (void)fault(-op->error, true);
      const uint32_t block = op->table_block;
      const bool again = d.table_dirty[block] != 0;
      finish_op(op);
      if (again) {
        d.table_dirty[block] = 0;
        write_table_block(d.index, block);
      }
      return;
    }
    case Op::kClear: {
      ++counters_.header_clears;
      if (op->error) (void)fault(-op->error, true);
      Slot& s = slots_[op->handle];
      s.clear_when_idle = false;
      release_physical(s);
      release_handle(op->handle);
      finish_op(op);
      return;
    }
    case Op::kSync: {
      devices_[op->device]->syncing = false;
      ++counters_.syncs;
      if (op->error) (void)fault(-op->error, true);
      finish_op(op);
      return;
    }
  }
}

Status DiskTier::fault(int err, bool write) noexcept {
  Status st = err == ENOSPC    ? Status(Code::kNoSpace, "the disk tier's file system is full")
              : err == ENODATA ? Status(Code::kCorrupt, "read past the end of a slab file (truncated?)")
                               : Status::from_errno(write ? "disk write failed" : "disk read failed", err);
  if (err == ENOSPC)
    ++counters_.no_space;
  else if (err == ENODATA)
    ++counters_.end_of_file;
  else
    ++counters_.io_errors;
  bool first = false;
  try {
    first = logged_.insert({err, write}).second;
  } catch (const std::bad_alloc&) {}
  if (first)
    spdlog::warn(
        "namespace '{}': disk tier {} failed: {} (errno {}); further faults of this kind are only counted "
        "(kdnctl stats)",
        options_.name_space, write ? "write" : "read", std::strerror(err), err);
  if (write && ++consecutive_write_errors_ >= kDegradeAfter) {
    consecutive_write_errors_ = 0;
    degraded_until_ns_ = now_ns() + kDegradeNs;
    ++counters_.degraded_periods;
    spdlog::warn(
        "namespace '{}': {} disk writes failed in a row: the disk tier takes no new chunks for {} s "
        "(evicted chunks are dropped meanwhile)",
        options_.name_space, kDegradeAfter, kDegradeNs / 1'000'000'000);
  }
  return st;
}

void DiskTier::complete_transfer(Op* op, Status st) noexcept {
  ready_.push_back(TierCompletion{op->id, st});  // capacity reserved at submit
  last_transfer_ns_ = now_ns();
  finish_op(op);
}

namespace {

// Encodes the chunk at `src` with op->codec on a worker; on success the op's payload is the
// blob (a block smaller than the chunk at least, or it is not worth a slot of its own).
bool encode_op(DiskTier::Op* op, const std::byte* src) noexcept {
  ChunkEncoding e;
  if (!encode_chunk(op->geometry, op->chunk.fingerprint, src, uint8_t(op->codec), kBlock, &e)) return false;
  op->payload = std::move(e.blob);
  op->stored = e.bytes;
  op->crc = e.crc;
  op->raw_hash = e.raw_hash;
  return true;
}

}  // namespace

// ---- writes ----------------------------------------------------------------------------------------------

Status DiskTier::submit(const Transfer& t) noexcept {
  const uint64_t h = t.placement.offset;
  if (!t.placement.valid() || h >= slots_.size() || !slots_[h].live || t.host == nullptr || t.bytes == 0 ||
      t.bytes > slots_[h].raw_bytes)
    return Status(Code::kInvalidArgument, "disk transfer outside its placement");
  if (reinterpret_cast<uintptr_t>(t.host) % kBlock != 0)
    return Status(Code::kInvalidArgument, "disk transfers need block-aligned host memory");
  Slot& s = slots_[h];
  if (t.direction == Transfer::Direction::kRead && !s.written)
    return Status(Code::kInvalidArgument, "nothing was written to this placement");
  try {
    ready_.reserve(ready_.size() + (submitted_ - reaped_) + 1);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "disk tier completion queue");
  }
  Op* op = new_op(t.direction == Transfer::Direction::kRead ? Op::kRead : Op::kWrite);
  if (op == nullptr) return Status(Code::kNoMemory, "disk tier operation");
  op->transfer = true;
  op->id = t.id;
  op->handle = uint32_t(h);
  op->host = t.host;
  op->bytes = t.bytes;
  op->chunk = t.chunk;
  op->device = s.device;
  ++submitted_;
  last_transfer_ns_ = now_ns();
  if (t.direction == Transfer::Direction::kRead) {
    ++s.busy;
    op->want_crc = s.crc;
    op->want_codec = s.codec;
    op->want_hash = s.raw_hash;
    op->want_fingerprint = s.fingerprint;
    op->stored = s.stored_bytes;
    std::byte* dst = t.host;
    if (s.codec != DiskCodec::kNone) {
      op->payload = AlignedBuffer(s.stored_bytes);
      if (op->payload.data() == nullptr) {
        complete_transfer(op, Status(Code::kNoMemory, "disk read buffer"));
        --s.busy;
        return OkStatus();
      }
      dst = op->payload.data();
    }
    op->io[0] = IoRequest{IoKind::kRead, 0, file_offset(s) + kBlock, dst, round_block(s.stored_bytes)};
    start_io(op, s.device, op->io[0]);
    return OkStatus();
  }
  s.written = false;
  s.key = t.chunk.key;
  s.fingerprint = t.chunk.fingerprint;
  s.raw_bytes = t.bytes;
  const kernels::ChunkGeometry* g = geometries_.find(t.chunk.fingerprint, t.bytes);
  const bool compress = options_.codec != DiskCodec::kNone && g != nullptr;
  if (compress) {
    op->geometry = *g;
    op->has_geometry = true;
  }
  op->mark_pending = options_.codec != DiskCodec::kNone && options_.reencode;
  try {
    if (compress && encoding_ < options_.encode_queue) {
      op->codec = options_.codec;
      op->encode_job = true;
      workers_->post([this, op] {
        op->encoded = encode_op(op, op->host);
        if (!op->encoded) {  // incompressible, or not encodable (NaN in a quantized mode): raw, for good
          op->codec = DiskCodec::kNone;
          op->mark_pending = false;
          op->stored = op->bytes;
          op->crc = disk::crc32c(op->host, op->bytes);
        }
        workers_->done(op);
      });
      ++encoding_;
      return OkStatus();
    }
    if (compress) ++counters_.raw_for_backlog;
    op->codec = DiskCodec::kNone;
    op->stored = t.bytes;
    // The payload goes out now; its CRC is computed meanwhile (on the loop, in slices), and
    // the header follows both.
    checksums_.push_back(op);
    start_payload(op);
  } catch (const std::bad_alloc&) {
    --submitted_;
    ops_.erase(op);
    delete op;
    return Status(Code::kNoMemory, "disk worker queue");
  }
  return OkStatus();
}

void DiskTier::start_payload(Op* op) noexcept {
  Slot& s = slots_[op->handle];
  if (op->encoded) {
    // The chunk shrank: move it into a slot of its size when one is free (same directory first).
    const uint64_t want = disk::slot_bytes_for(op->stored, true);
    if (want < s.slot_bytes) {
      Slot smaller;
      if (place(smaller, want, s.device)) {
        release_physical(s);
        s.device = smaller.device;
        s.dev_class = smaller.dev_class;
        s.offset = smaller.offset;
        s.slot_bytes = smaller.slot_bytes;
        s.placed = true;
      }
    }
  }
  op->device = s.device;
  op->stage = 0;
  std::byte* src = op->encoded ? op->payload.data() : op->host;
  op->io[0] = IoRequest{IoKind::kWrite, 0, file_offset(s) + kBlock, src, round_block(op->stored)};
  start_io(op, s.device, op->io[0]);
}

// The header is written only once its payload landed and its CRC is known: a header on disk
// always describes a whole payload (a crash before it leaves the slot's old header, whose CRC
// the new payload fails: never a chunk served wrong).
void DiskTier::maybe_write_header(Op* op) noexcept {
  if (!op->payload_done || !op->crc_done) return;
  const bool reencode = op->kind == Op::kReencode;
  if (op->error) {
    if (reencode) return on_reencode_written(op);
    complete_transfer(op, fault(-op->error, true));
    return;
  }
  Slot& s = reencode ? op->target : slots_[op->handle];
  const Slot& meta = slots_[op->handle];
  op->header = header_block();
  if (op->header == nullptr) {
    op->error = -ENOMEM;
    if (reencode) return on_reencode_written(op);
    complete_transfer(op, Status(Code::kNoMemory, "disk header buffer"));
    return;
  }
  disk::SlotHeader h;
  std::memcpy(h.file_id, devices_[s.device]->super.file_id, 16);
  h.slot_offset = file_offset(s);
  h.slot_bytes = s.slot_bytes;
  h.key = reencode ? meta.key : op->chunk.key;
  h.fingerprint = reencode ? meta.fingerprint : op->chunk.fingerprint;
  h.sequence = next_sequence_++;
  h.raw_bytes = op->bytes;
  h.stored_bytes = op->stored;
  h.codec = op->codec;
  h.payload_crc = op->crc;
  h.raw_hash = op->raw_hash;
  h.name_space = options_.name_space;
  h.written_unix_ns = disk_detail::now_unix_ns();
  disk::encode_slot_header(h, op->header);
  s.sequence = h.sequence;
  if (!reencode) {
    s.stored_bytes = op->stored;
    s.codec = op->codec;
    s.crc = op->crc;
    s.raw_hash = op->raw_hash;
  }
  op->stage = reencode ? 3 : 1;
  op->io[1] = IoRequest{IoKind::kWrite, 0, h.slot_offset, op->header, kBlock};
  start_io(op, s.device, op->io[1]);
}

void DiskTier::on_write_done(Op* op) noexcept {
  Slot& s = slots_[op->handle];
  if (op->error) {
    s.written = false;
    complete_transfer(op, fault(-op->error, true));
    return;
  }
  consecutive_write_errors_ = 0;
  s.written = true;
  ++counters_.writes;
  counters_.write_bytes += round_block(op->stored) + kBlock;  // payload and header
  counters_.raw_bytes_written += op->bytes;
  counters_.stored_bytes_written += op->stored;
  if (op->encoded) ++counters_.encoded_writes;
  if (op->mark_pending && !op->encoded && !s.pending_reencode) {
    s.pending_reencode = true;
    ++pending_reencode_;
  }
  devices_[s.device]->dirty = true;
  complete_transfer(op, OkStatus());
}

// ---- reads -----------------------------------------------------------------------------------------------

namespace {

// The worker half of a read: the stored bytes' CRC, then (KVC1) the decode into the arena and,
// for lossless, the original's hash.
Status verify_and_decode(DiskTier::Op* op) noexcept {
  const std::byte* stored = op->want_codec == DiskCodec::kNone ? op->host : op->payload.data();
  if (disk::crc32c(stored, op->stored) != op->want_crc)
    return Status(Code::kCorrupt, "a chunk read from disk failed its CRC32C");
  if (op->want_codec == DiskCodec::kNone) return OkStatus();
  return decode_chunk(stored, op->stored, uint8_t(op->want_codec), op->want_fingerprint, op->want_hash, op->host,
                      op->bytes);
}

}  // namespace

void DiskTier::finish_read(Op* op, Status st) noexcept {
  Slot& s = slots_[op->handle];
  const uint32_t h = op->handle;
  if (st.ok()) {
    ++counters_.reads;
    counters_.read_bytes += round_block(op->stored);
    if (op->want_codec != DiskCodec::kNone) ++counters_.decoded_reads;
  } else if (st.code() == Code::kCorrupt && op->error == 0) {
    ++(std::strstr(st.what(), "CRC32C") ? counters_.crc_mismatch : counters_.decode_errors);
    bool first = false;
    try {
      first = logged_.insert({-1, false}).second;
    } catch (const std::bad_alloc&) {}
    if (first)
      spdlog::warn(
          "namespace '{}': disk tier read: {}: the copy is dropped, never served; further damaged chunks "
          "are only counted (kdnctl stats)",
          options_.name_space, st.what());
  }
  complete_transfer(op, st);
  --s.busy;
  idle_slot_done(h);
}

void DiskTier::on_read_done(Op* op) noexcept {
  if (op->error) return finish_read(op, fault(-op->error, false));
  if (op->want_codec == DiskCodec::kNone) {  // checked on the loop, in slices
    try {
      checksums_.push_back(op);
      return;
    } catch (const std::bad_alloc&) {
      return finish_read(op, verify_and_decode(op));
    }
  }
  try {
    workers_->post(
        [this, op] {
          op->status = verify_and_decode(op);
          workers_->done(op);
        },
        Workers::Lane::kQuick);
  } catch (const std::bad_alloc&) {
    finish_read(op, verify_and_decode(op));  // no worker queue: check here, late rather than never
  }
}

void DiskTier::on_worker(Op* op) noexcept {
  switch (op->kind) {
    case Op::kWrite:  // encoded (or fallen back to raw): its CRC is known; write it
      --encoding_;
      op->encode_job = false;
      op->crc_done = true;
      start_payload(op);
      return;
    case Op::kRead:
      return finish_read(op, op->status);
    case Op::kReencode:
      return on_reencode_encoded(op);
    default:
      return;
  }
}

void DiskTier::run_checksums(uint64_t budget) noexcept {
  while (!checksums_.empty() && budget > 0) {
    Op* op = checksums_.front();
    const bool read = op->kind == Op::kRead;
    const std::byte* p = op->host;  // uncompressed: the arena bytes, read in or to be written
    const uint64_t total = read ? op->stored : op->bytes;
    const uint64_t n = std::min(budget, total - op->crc_done_bytes);
    op->crc = disk::crc32c_extend(op->crc, p + op->crc_done_bytes, n);
    op->crc_done_bytes += n;
    budget -= n;
    if (op->crc_done_bytes < total) break;
    checksums_.pop_front();
    if (read) {
      finish_read(op, op->crc == op->want_crc ? OkStatus()
                                              : Status(Code::kCorrupt, "a chunk read from disk failed its CRC32C"));
    } else {
      op->crc_done = true;
      maybe_write_header(op);
    }
  }
}

size_t DiskTier::reap(std::span<TierCompletion> out) noexcept {
  service();
  size_t n = std::min(out.size(), ready_.size());
  for (size_t i = 0; i < n; ++i) out[i] = ready_[i];
  ready_.erase(ready_.begin(), ready_.begin() + ptrdiff_t(n));
  reaped_ += n;
  return n;
}

void DiskTier::service() noexcept {
  // The wake fd is drained by the loop where epoll reports it; here the rings and the done
  // queue are looked at directly (no system call per loop iteration).
  for (auto& d : devices_) d->ring->reap([this](IoRequest* io) { on_io(io); });
  std::vector<Op*> done;
  workers_->take_done(done);
  for (Op* op : done) on_worker(op);
  run_checksums(options_.checksum_slice_bytes);
  maybe_sync(0);
  for (auto& d : devices_) {
    Status st = d->ring->flush();
    if (!st.ok()) {
      bool first = false;
      try {
        first = logged_.insert({st.sys_errno(), false}).second;
      } catch (const std::bad_alloc&) {}
      if (first)
        spdlog::error("namespace '{}': io_uring_submit: {}", options_.name_space, std::strerror(st.sys_errno()));
    }
  }
}

// ---- background work ---------------------------------------------------------------------------------------

void DiskTier::write_table_block(uint32_t d, uint32_t block) noexcept {
  Device& dev = *devices_[d];
  if (dev.table_writing[block]) {
    dev.table_dirty[block] = 1;  // written again once the write in flight lands
    return;
  }
  Op* op = new_op(Op::kTable);
  if (op == nullptr) return;
  op->payload = AlignedBuffer(kBlock);
  if (op->payload.data() == nullptr) return finish_op(op);
  std::memcpy(op->payload.data(), dev.table.data() + uint64_t{block} * kBlock, kBlock);
  op->device = d;
  op->table_block = block;
  dev.table_writing[block] = 1;
  op->io[0] = IoRequest{IoKind::kWrite, 0, dev.super.layout.table_offset + uint64_t{block} * kBlock, op->payload.data(),
                        kBlock};
  start_io(op, d, op->io[0]);
}

void DiskTier::clear_header(uint32_t h) noexcept {
  Slot& s = slots_[h];
  Op* op = new_op(Op::kClear);
  if (op == nullptr) {  // no memory: the header stays (a restart may revive it)
    release_physical(s);
    release_handle(h);
    return;
  }
  op->handle = h;
  op->device = s.device;
  op->io[0] = IoRequest{IoKind::kWrite, 0, file_offset(s), zero_block_, kBlock};
  start_io(op, s.device, op->io[0]);
}

void DiskTier::maybe_sync(uint64_t now) noexcept {
  (void)now;
  if (!options_.fsync_batch) return;
  for (auto& d : devices_) {
    if (!d->dirty || d->syncing) continue;
    Op* op = new_op(Op::kSync);
    if (op == nullptr) return;
    d->dirty = false;
    d->syncing = true;
    op->device = d->index;
    op->io[0] = IoRequest{IoKind::kSync, 0, 0, nullptr, 0};
    start_io(op, d->index, op->io[0]);
  }
}

void DiskTier::housekeeping(uint64_t now) noexcept {
  maybe_sync(now);
  if (!options_.reencode || options_.codec == DiskCodec::kNone || pending_reencode_ == 0) return;
  if (in_flight() > 0 || now - last_transfer_ns_ < options_.idle_ns) return;
  const uint32_t max = std::max<uint32_t>(1, options_.workers);
  while (reencoding_ < max && pending_reencode_ > 0) {
    const uint64_t before = reencoding_;
    start_reencode();
    if (reencoding_ == before) break;
  }
  for (auto& d : devices_) (void)d->ring->flush();
}

void DiskTier::start_reencode() noexcept {
  for (uint32_t h = 0; h < slots_.size(); ++h) {
    Slot& s = slots_[h];
    if (!s.live || !s.written || !s.pending_reencode || s.busy > 0 || s.codec != DiskCodec::kNone) continue;
    const kernels::ChunkGeometry* g = geometries_.find(s.fingerprint, s.raw_bytes);
    if (g == nullptr) continue;  // model unknown yet
    Op* op = new_op(Op::kReencode);
    if (op == nullptr) return;
    op->payload = AlignedBuffer(s.stored_bytes);
    if (op->payload.data() == nullptr) return finish_op(op);
    op->handle = h;
    op->device = s.device;
    op->geometry = *g;
    op->has_geometry = true;
    op->bytes = s.raw_bytes;
    op->stored = s.stored_bytes;
    op->want_crc = s.crc;
    op->chunk = ChunkIdentity{s.key, s.fingerprint};
    op->sequence_at_start = s.sequence;
    op->codec = options_.codec;
    ++s.busy;
    ++reencoding_;
    op->io[0] = IoRequest{IoKind::kRead, 0, file_offset(s) + kBlock, op->payload.data(), round_block(s.stored_bytes)};
    start_io(op, s.device, op->io[0]);
    return;
  }
}

namespace {

void abandon_pending(DiskTier::Slot& s, uint64_t& pending) {
  if (s.pending_reencode) {
    s.pending_reencode = false;
    --pending;
  }
}

}  // namespace

void DiskTier::on_reencode_read(Op* op) noexcept {
  Slot& s = slots_[op->handle];
  if (op->error || disk::crc32c(op->payload.data(), op->stored) != op->want_crc) {
    // A read's own check will find what is wrong; this pass just leaves the chunk alone.
    abandon_pending(s, pending_reencode_);
    --s.busy;
    --reencoding_;
    const uint32_t h = op->handle;
    finish_op(op);
    idle_slot_done(h);
    return;
  }
  op->stage = 1;
  try {
    workers_->post([this, op] {
      op->encoded = encode_op(op, op->payload.data());
      workers_->done(op);
    });
  } catch (const std::bad_alloc&) {
    op->encoded = false;
    on_reencode_encoded(op);
  }
}

void DiskTier::on_reencode_encoded(Op* op) noexcept {
  Slot& s = slots_[op->handle];
  const uint32_t h = op->handle;
  auto give_up = [&](bool for_good) {
    if (for_good) abandon_pending(s, pending_reencode_);
    --s.busy;
    --reencoding_;
    finish_op(op);
    idle_slot_done(h);
  };
  if (!op->encoded) return give_up(true);
  if (!s.live || s.release_when_idle || s.sequence != op->sequence_at_start) return give_up(false);
  if (!place(op->target, disk::slot_bytes_for(op->stored, true), s.device)) return give_up(false);
  op->stage = 2;
  op->payload_done = false;
  op->crc_done = true;
  op->device = op->target.device;
  op->error = 0;
  op->io[0] =
      IoRequest{IoKind::kWrite, 0, file_offset(op->target) + kBlock, op->payload.data(), round_block(op->stored)};
  start_io(op, op->target.device, op->io[0]);
}

void DiskTier::on_reencode_written(Op* op) noexcept {
  Slot& s = slots_[op->handle];
  const uint32_t h = op->handle;
  // Swap only if nothing else reads the old bytes and the chunk was not rewritten or freed.
  const bool swap =
      op->error == 0 && s.live && !s.release_when_idle && s.busy == 1 && s.sequence == op->sequence_at_start;
  if (op->error) (void)fault(-op->error, true);
  if (swap) {
    const uint64_t saved = s.stored_bytes > op->stored ? s.stored_bytes - op->stored : 0;
    release_physical(s);  // clears pending_reencode
    s.device = op->target.device;
    s.dev_class = op->target.dev_class;
    s.offset = op->target.offset;
    s.slot_bytes = op->target.slot_bytes;
    s.placed = true;
    s.written = true;
    s.stored_bytes = op->stored;
    s.crc = op->crc;
    s.codec = op->codec;
    s.raw_hash = op->raw_hash;
    s.sequence = op->target.sequence;
    ++counters_.reencoded;
    counters_.reencode_saved_bytes += saved;
    devices_[s.device]->dirty = true;
  } else {
    release_physical(op->target);  // a copy with a higher sequence stays on disk: the same bytes
  }
  --s.busy;
  --reencoding_;
  finish_op(op);
  idle_slot_done(h);
}

void DiskTier::drain() noexcept {
  for (;;) {
    service();
    if (ops_.empty()) return;
    bool waited = false;
    for (auto& d : devices_) {
      if (d->ring->in_flight() > 0) {
        (void)d->ring->wait();
        waited = true;
        break;
      }
    }
    if (!waited) std::this_thread::sleep_for(std::chrono::microseconds(200));  // a worker job finishing
  }
}

}  // namespace kdn::sidecar
