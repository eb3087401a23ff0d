// DiskTier: T2, one namespace's chunks in slab files on NVMe, read and written with io_uring.
//
// Files. One slab file per disk directory (one directory per device): <dir>/<namespace>/slabs.kdn,
// created at the configured size with fallocate and then written once, so its extents are
// initialized and an overwrite never turns into a metadata update. Opened O_DIRECT: chunks go
// between the device and the host arena without the page cache. docs/disk-format.md has the
// bytes; disk_format.h reads and writes them.
//
// Placements. A placement's offset is a handle into this tier's slot table, not a file
// address: the tier may move a chunk's bytes (the background pass re-encodes raw chunks into
// smaller slots) without the index knowing. Chunks are striped over the directories, one
// chunk per directory in turn. Each directory's data area is cut into slabs of one size class
// by a SlabAllocator, as the host arena is; the slab table in the file records each slab's class
// so a restart can find the slot headers.
//
// Transfers. A write (demotion, or a copy on commit under write_through) computes the payload's
// CRC32C — or encodes it with the namespace's codec first, on a worker — and writes payload and
// slot header as two O_DIRECT writes from registered buffers. A read goes straight into the arena
// (READ_FIXED) and is served only once its CRC matched (and, for KVC1 payloads, once it decoded
// on a worker, bit-exact against the stored hash for lossless). A torn or damaged chunk
// completes with kCorrupt and is never served. Small checks run on the loop; large ones and
// every codec step on the tier's worker threads. Nothing blocks the loop: submissions are
// prepared during the loop iteration and handed to the kernel in one io_uring_enter, and
// completions — io_uring's and the workers' — signal one eventfd in kdnd's epoll set.
//
// Compression at rest. With a codec, a demotion is encoded on a worker; when the encoders fall
// behind (more than `encode_queue` chunks waiting), the chunk is written raw instead and marked
// for the background pass, which re-encodes raw chunks while the tier has no transfers.
//
// Restart. open() reads the superblock, the slab table and every slot header of the slabs in use
// (never a payload) and returns the chunks it found; the newest copy of a key wins.
//
// Thread safety: every method is called from the event loop thread (open() from the thread
// starting the daemon). Workers touch only the bytes of the jobs they run and the done queue.
#pragma once

#include "chunk_codec.h"
#include "disk/disk_io.h"
#include "disk/disk_ring.h"
#include "disk_format.h"
#include "tier.h"
#include "tiers/slab_allocator.h"

#include <kdn/common/model.h>
#include <kdn/ipc/fd.h>
#include <kdn/kernels/layout.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace kdn::sidecar {

template <class Item>
class WorkerPool;

struct DiskTierOptions {
  std::vector<std::string> dirs;  // one per device; each must exist
  std::string name_space;
  uint64_t bytes_per_dir = 0;  // data area of each directory's slab file
  uint64_t slab_bytes = 64ull << 20;
  uint32_t queue_depth = 32;     // per directory
  bool register_buffers = true;  // fixed buffers (needs RLIMIT_MEMLOCK or CAP_IPC_LOCK)
  uint32_t workers = 2;
  // Checksums of uncompressed chunks run on the loop thread, in slices of this many bytes
  // between its other work (about 20 us each): no thread hop per chunk.
  uint64_t checksum_slice_bytes = 256ull << 10;
  disk::DiskCodec codec = disk::DiskCodec::kNone;
  uint32_t encode_queue = 8;       // chunks waiting for an encoder before demotions go raw
  bool reencode = true;            // the background pass re-encodes raw chunks when idle
  uint64_t idle_ns = 100'000'000;  // no transfers for this long: the tier is idle
  bool fsync_batch = false;        // disk_fsync = batch
  std::span<std::byte> arena;      // the host arena: registered as fixed buffers
};

struct RecoveryReport {
  uint64_t slabs_scanned = 0, headers_read = 0, chunks = 0, bytes = 0;
  uint64_t stale = 0;    // older copies of a key a newer slot holds
  uint64_t invalid = 0;  // slots whose header is absent, torn, or of another file
  double seconds = 0;
  bool created = false;  // at least one file was new
};

struct DiskCounters {
  uint64_t reads = 0, read_bytes = 0, writes = 0, write_bytes = 0;
  uint64_t raw_bytes_written = 0, stored_bytes_written = 0;  // codec ratio = raw / stored
  uint64_t decoded_reads = 0, encoded_writes = 0, raw_for_backlog = 0;
  uint64_t reencoded = 0, reencode_saved_bytes = 0;
  uint64_t table_writes = 0, header_clears = 0, syncs = 0;
  // Faults by kind.
  uint64_t io_errors = 0, no_space = 0, end_of_file = 0, crc_mismatch = 0, decode_errors = 0;
  uint64_t short_transfers = 0, retries = 0;
  uint64_t degraded_periods = 0;
};

class DiskTier final : public Tier {
 public:
  // Opens (creating when absent) every directory's slab file and recovers the chunks they
  // hold into *recovered. Errors name the directory: missing, not writable, no O_DIRECT, a
  // file of another geometry.
  static Result<std::unique_ptr<DiskTier>> open(const DiskTierOptions& options, DiskIo& io,
                                                std::vector<RecoveredChunk>* recovered,
                                                RecoveryReport* report) noexcept;
  ~DiskTier() override;  // waits for every I/O and job in flight

  // ---- Tier
  TierId id() const noexcept override { return TierId::kDisk; }
  TierCapabilities capabilities() const noexcept override { return {false, true, true, true}; }
  uint64_t capacity_bytes() const noexcept override;
  uint64_t used_bytes() const noexcept override;
  Result<uint16_t> slot_class(uint64_t bytes) noexcept override;
  Result<Placement> allocate(uint64_t bytes) noexcept override;
  void free(const Placement& placement) noexcept override;
  void discard(const Placement& placement) noexcept override;
  Status submit(const Transfer& t) noexcept override;
  int wake_fd() const noexcept override { return wake_.get(); }
  size_t reap(std::span<TierCompletion> out) noexcept override;
  uint64_t in_flight() const noexcept override { return submitted_ - reaped_; }

  // ---- the daemon's loop (tier.h's hooks; disk_tier_hooks.cc)
  void learn_model(const ModelInfo& model) noexcept override;  // its demotions can be encoded
  // Background work (slab table writes, re-encoding, fdatasync) moves on while no transfer is
  // in flight (the store's reaps move it on otherwise); checksums computed on the loop keep it
  // awake.
  bool advance(bool store_idle) noexcept override;
  bool wants_housekeeping() const noexcept override { return pending_reencode_ > 0 || background_busy(); }
  // Starts background work that is due: re-encoding when idle, batched fdatasync.
  void housekeeping(uint64_t now_ns) noexcept override;
  uint64_t queue_room() const noexcept override;
  void drain() noexcept override;  // waits for every operation in flight (shutdown)
  void describe_stats(ipc::TierStatsRecord& r) const noexcept override;
  void describe_metrics(MetricsSink& sink) const override;

  // Moves every stage of every operation on (completions, worker results, queued
  // submissions) and flushes submissions. reap() and advance() call it.
  void service() noexcept;
  bool background_busy() const noexcept { return background_ops_ > 0; }
  // Checksums wait to be computed on the loop: keep calling service() rather than sleeping.
  bool has_loop_work() const noexcept { return !checksums_.empty(); }

  const DiskCounters& counters() const noexcept { return counters_; }
  RingCounters ring_counters() const noexcept;
  bool buffers_registered() const noexcept { return registered_; }
  bool degraded() const noexcept;
  disk::DiskCodec codec() const noexcept { return options_.codec; }
  uint64_t pending_reencode() const noexcept { return pending_reencode_; }
  uint32_t devices() const noexcept { return uint32_t(devices_.size()); }
  // The slab file of directory d (tests damage it; operators read its name in logs).
  const std::string& file_path(uint32_t d) const noexcept;
  // Where a placement's stored bytes are: (directory, file offset of its header, stored
  // bytes); false for a placement with nothing written (tests and kdnctl).
  bool locate(const Placement& p, uint32_t* device, uint64_t* header_offset, uint64_t* stored) const noexcept;

  struct Device;
  struct Slot;
  struct Op;
  using Workers = WorkerPool<Op>;

 private:
  explicit DiskTier(const DiskTierOptions& options, DiskIo& io);
  // ---- opening (disk_tier_open.cc): open, scan, recover
  struct Found;
  Status open_devices(std::vector<RecoveredChunk>* recovered, RecoveryReport* report) noexcept;
  Status open_device(uint32_t i, const disk::FileLayout& want, RecoveryReport* report) noexcept;
  Status open_device_dir(Device& d, const std::string& root) noexcept;
  Status open_slab_file(Device& d, const disk::FileLayout& want, bool* create) noexcept;
  Status check_slab_file(const Device& d) noexcept;
  Status create_slab_file(Device& d, const disk::FileLayout& want) noexcept;
  Status load_slab_table(Device& d) noexcept;
  Status scan_device(Device& d, RecoveryReport* report, std::vector<Found>* found, uint64_t* last_log) noexcept;
  Status adopt_newest(const std::vector<Found>& found, std::vector<RecoveredChunk>* recovered,
                      RecoveryReport* report) noexcept;
  Status adopt_found(const Found& f, std::vector<RecoveredChunk>* recovered, RecoveryReport* report);
  Status register_buffers() noexcept;

  // ---- slots and space
  Result<uint32_t> new_handle() noexcept;
  // A physical slot of `slot_bytes` on device d (preferring it) or any other; updates the slab
  // table when a slab changes class.
  bool place(Slot& s, uint64_t slot_bytes, uint32_t prefer) noexcept;
  void release_physical(Slot& s) noexcept;
  void release_handle(uint32_t h) noexcept;
  void note_slab_taken(uint32_t d, uint64_t offset, uint64_t slot_bytes) noexcept;
  uint64_t file_offset(const Slot& s) const noexcept;

  // ---- operations
  Op* new_op(int kind) noexcept;
  void finish_op(Op* op) noexcept;
  void start_io(Op* op, uint32_t device, IoRequest& io) noexcept;
  void on_io(IoRequest* io) noexcept;
  void on_worker(Op* op) noexcept;
  void complete_transfer(Op* op, Status st) noexcept;
  void start_payload(Op* op) noexcept;
  void maybe_write_header(Op* op) noexcept;
  void on_write_done(Op* op) noexcept;
  void on_read_done(Op* op) noexcept;
  void finish_read(Op* op, Status st) noexcept;
  // Computes queued checksums, up to `budget` bytes; finishes the operations they complete.
  void run_checksums(uint64_t budget) noexcept;
  void start_reencode() noexcept;
  void on_reencode_read(Op* op) noexcept;
  void on_reencode_encoded(Op* op) noexcept;
  void on_reencode_written(Op* op) noexcept;
  void write_table_block(uint32_t d, uint32_t slab) noexcept;
  void clear_header(uint32_t handle) noexcept;
  void maybe_sync(uint64_t now_ns) noexcept;
  void idle_slot_done(uint32_t handle) noexcept;
  Status fault(int err, bool write) noexcept;
  std::byte* header_block() noexcept;
  void return_header_block(std::byte* b) noexcept;

  DiskTierOptions options_;
  DiskIo& io_;
  ipc::UniqueFd wake_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_handles_;
  std::vector<uint64_t> tier_classes_;  // raw chunk bytes of each tier class
  ChunkGeometries geometries_;
  std::unique_ptr<Workers> workers_;
  std::vector<TierCompletion> ready_;
  std::deque<Op*> checksums_;            // operations whose CRC the loop computes, in slices
  std::set<Op*> ops_;                    // every operation alive
  std::vector<std::byte*> header_free_;  // registered header blocks
  std::byte* header_pool_ = nullptr;
  uint64_t header_pool_blocks_ = 0;
  // One block of zeros, the source of every header clear (read-only once made: clears of
  // freed slots need no memory of their own, however many run at once).
  std::byte* zero_block_ = nullptr;
  bool registered_ = false;
  uint32_t next_device_ = 0;
  uint64_t next_sequence_ = 1;
  uint64_t submitted_ = 0, reaped_ = 0;
  uint64_t background_ops_ = 0;
  uint64_t encoding_ = 0;  // encode jobs posted and not done
  uint64_t reencoding_ = 0;
  uint64_t pending_reencode_ = 0;
  uint64_t last_transfer_ns_ = 0;
  uint32_t consecutive_write_errors_ = 0;
  uint64_t degraded_until_ns_ = 0;
  std::set<std::pair<int, bool>> logged_;  // (errno, write) causes already logged
  DiskCounters counters_;
};

}  // namespace kdn::sidecar
