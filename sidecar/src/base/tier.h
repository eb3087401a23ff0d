// Tier: the south-bound seam under kdnd's chunk index. A tier is memory or storage that can
// hold chunk copies — the host arena (T1), NVMe slabs (T2) and a remote store (T3) — behind
// one small interface, in the manner of NIXL's backend engines,
// ggml's buffer types and LevelDB's Env:
//
//   capabilities, capacity          what it is and how much it holds
//   allocate / free                 a Placement: where one chunk's copy lives in this tier
//   address                         the bytes of a placement, for tiers in this process's memory
//   submit                          an asynchronous transfer between a placement and host memory,
//                                   tagged with an operation id
//   wake_fd + reap                  completions: the fd becomes readable when some are ready
//                                   (it sits in kdnd's epoll set), reap() takes them, never
//                                   blocking; every submitted transfer completes exactly once
//
// Moving a chunk between two tiers is a transfer of one of them from or to the other's host
// address: the host arena is the hub every other tier reads into and writes from.
//
// Beside that, optional hooks (no-ops by default) give a tier what it needs of the daemon's
// loop — models to learn, a socket to poll, work to move on each turn or at housekeeping, a
// deadline, a drain before exit — and let it describe its own counters to TIER_STATS and the
// metrics page. Nothing above the seam names a concrete tier: a new tier is its class and one
// line in the tier factory (tier_factory.h).
//
// T0, the GPU pools, is not a Tier: it holds copies of host-tier chunks only (inclusive of T1),
// serves GPU engines alone, and reaches the store only through leases, like any client
// (gpu/gpu_service.h).
//
// Ownership: the caller keeps the host memory of a transfer alive and the placement
// allocated until the completion is reaped. Thread safety: every method is called from the
// daemon's event loop thread; implementations may complete transfers on their own threads
// and hand completions over through wake_fd/reap.
#pragma once

#include <kdn/common/model.h>
#include <kdn/common/status.h>
#include <kdn/ipc/protocol.h>
#include <kdn/kdn.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace kdn::sidecar {

enum class TierId : uint8_t { kGpu = 0, kHost = 1, kDisk = 2, kRemote = 3 };
constexpr uint32_t kTierCount = 4;
constexpr uint32_t tier_index(TierId t) { return static_cast<uint32_t>(t); }
const char* tier_name(TierId t) noexcept;

// Where a tier describes its own counters for kdnd's metrics page: one call per value, under
// its whole Prometheus name (kdn_<tier>_...). The page groups each family across namespaces.
class MetricsSink {
 public:
  enum class Kind : uint8_t { kCounter, kGauge };
  virtual void add(const char* name, Kind kind, const char* help, uint64_t value) = 0;

 protected:
  ~MetricsSink() = default;
};

// Where a chunk's copy lives in one tier. Opaque to everyone but the tier that made it.
struct Placement {
  uint64_t offset = 0;      // tier-specific address (arena offset, file slot, ...)
  uint64_t bytes = 0;       // bytes allocated; 0 = no placement
  uint16_t slot_class = 0;  // the tier's size class (eviction queues are per class)
  bool valid() const noexcept { return bytes != 0; }
};

struct TierCapabilities {
  bool host_addressable = false;  // address() gives the bytes (the tier is host memory)
  bool asynchronous = false;      // transfers complete on other threads or devices
  bool persistent = false;        // copies survive a kdnd restart
  bool indexed_at_start = false;  // a restart rebuilds the index from its copies (kdnd writes
                                  // the arena down to it before exiting)
};

using TransferId = uint64_t;

// What a transfer's bytes are. A persistent tier records it beside the bytes, so a restart can
// rebuild the index from what is on the device.
struct ChunkIdentity {
  kdn_key key{};
  kdn_key fingerprint{};  // the model's
};

// One transfer between a placement of this tier and host memory. Host memory is 4 KiB-aligned
// with room for `bytes` rounded up to 4 KiB (arena slots are), so a device doing direct I/O
// moves whole blocks.
struct Transfer {
  enum class Direction : uint8_t {
    kRead = 1,   // placement -> host
    kWrite = 2,  // host -> placement
  };
  Direction direction = Direction::kRead;
  Placement placement;
  std::byte* host = nullptr;  // destination of a read, source of a write
  uint64_t bytes = 0;         // <= placement.bytes
  TransferId id = 0;
  ChunkIdentity chunk;  // for writes
};

// A chunk a tier found at start (indexed_at_start), for the index to adopt.
struct RecoveredChunk {
  kdn_key key{};
  kdn_key fingerprint{};
  uint64_t raw_bytes = 0;
  Placement placement;
};

struct TierCompletion {
  TransferId id = 0;
  // kIo: the device failed; kNoSpace: it is full; kCorrupt: the bytes read failed the tier's
  // check, or are gone (a truncated file).
  Status status;
};

class Tier {
 public:
  virtual ~Tier() = default;

  virtual TierId id() const noexcept = 0;
  virtual TierCapabilities capabilities() const noexcept = 0;
  virtual uint64_t capacity_bytes() const noexcept = 0;
  virtual uint64_t used_bytes() const noexcept = 0;

  // The size class a placement of `bytes` gets, or kInvalidArgument if it can never fit.
  virtual Result<uint16_t> slot_class(uint64_t bytes) noexcept = 0;
  // A placement of `bytes`, or kNoSpace when the class has no free slot (the caller evicts
  // and tries again).
  virtual Result<Placement> allocate(uint64_t bytes) noexcept = 0;
  // Frees a placement; no transfer may still touch it.
  virtual void free(const Placement& placement) noexcept = 0;
  // Frees a placement whose copy must not come back: a persistent tier also erases what a
  // restart would find of it (a chunk found damaged, or evicted by an operator).
  virtual void discard(const Placement& placement) noexcept { free(placement); }
  // For host-addressable tiers, the bytes of a placement; null otherwise.
  virtual std::byte* address(const Placement& placement) const noexcept {
    (void)placement;
    return nullptr;
  }

  // Starts a transfer; exactly one completion with t.id follows, through reap(). A non-ok
  // return means the transfer was not started and nothing will complete.
  virtual Status submit(const Transfer& t) noexcept = 0;
  // Readable while completions wait (an eventfd), or -1 for a tier whose completions are
  // always ready by the time submit returns.
  virtual int wake_fd() const noexcept = 0;
  // Takes up to out.size() ready completions; returns how many. Never blocks.
  virtual size_t reap(std::span<TierCompletion> out) noexcept = 0;
  // Transfers submitted and not yet reaped.
  virtual uint64_t in_flight() const noexcept = 0;

  // ---- the daemon's loop: optional hooks, each a no-op by default. Loop thread only.
  // A model a session registered: a tier that encodes chunks learns its geometry here.
  virtual void learn_model(const ModelInfo& model) noexcept { (void)model; }
  // Moves on work outside the transfers the store reaps (background writes, timers, replies
  // on sockets), once per loop turn. `store_idle`: no transfer of the store is in flight.
  // Returns true while work waits that must keep the loop from sleeping.
  virtual bool advance(bool store_idle) noexcept {
    (void)store_idle;
    return false;
  }
  // A descriptor besides wake_fd() for the loop's epoll set (sockets), or -1; when it is
  // readable the loop calls on_poll_fd().
  virtual int poll_fd() const noexcept { return -1; }
  virtual void on_poll_fd() noexcept {}
  // When the tier next needs advance() on its own, in now_ns() time (UINT64_MAX: never).
  virtual uint64_t next_deadline_ns() const noexcept { return UINT64_MAX; }
  // Background work that moves on at the daemon's housekeeping period (true: keep the loop's
  // timer armed), and that period's call.
  virtual bool wants_housekeeping() const noexcept { return false; }
  virtual void housekeeping(uint64_t now_ns) noexcept { (void)now_ns; }
  // After the store applied completions: logs the faults met since the last call, once per
  // cause for the tier's life (`ns` names the namespace in the message).
  virtual void log_new_faults(std::string_view ns) noexcept { (void)ns; }
  // Transfers worth keeping in flight to keep the device busy (a bulk write-down before exit
  // keeps this many queued).
  virtual uint64_t queue_room() const noexcept { return 64; }
  // Waits for every operation in flight (kdnd is exiting).
  virtual void drain() noexcept {}
  // The tier's own counters: into its TIER_STATS record (the fields only it knows; the store
  // fills capacity, residency and hits), and onto the metrics page.
  virtual void describe_stats(ipc::TierStatsRecord& r) const noexcept { (void)r; }
  virtual void describe_metrics(MetricsSink& sink) const { (void)sink; }

  // ---- shared tiers (T3): other nodes write chunks this node's index has never seen.
  // Asks which of `chunks` the tier holds: (*exists)[i] becomes 1 or 0, then exactly one
  // completion with `id` follows through reap() (a non-ok return: none). The caller keeps
  // *exists alive until then.
  virtual Status probe(TransferId id, std::span<const ChunkIdentity> chunks, std::vector<uint8_t>* exists) noexcept {
    (void)id, (void)chunks, (void)exists;
    return Status(Code::kUnsupported, "this tier is not shared");
  }
  // A placement for a chunk another node wrote (one probe() found), so that it can be read.
  virtual Result<Placement> adopt(const ChunkIdentity& chunk, uint64_t raw_bytes) noexcept {
    (void)chunk, (void)raw_bytes;
    return Status(Code::kUnsupported, "this tier is not shared");
  }
};

}  // namespace kdn::sidecar
