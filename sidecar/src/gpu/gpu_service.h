// GpuService: kdnd's GPU tier (docs/gpu.md) — devices and their streams, T0 regions and their
// indexes, engine registrations, and the copy batches of GPU_RETRIEVE and GPU_STORE.
//
// Every CUDA call goes through cuda_api.h. Each device has one low-priority stream on which
// kdnd queues all of its work for that device, in order, so a bounce buffer and the request
// metadata area are reused safely in stream order; a batch ends with notify_after(), whose token
// comes back through the CompletionQueue's eventfd (in kdnd's epoll set) and is applied by
// poll(): leases and T0 pins taken for the batch are released, a GPU_STORE's request is woken.
// Nothing here waits for the GPU on the event loop, except the error path of a batch that could
// not be queued whole (it synchronizes its stream once so nothing it queued can still run).
//
// Off (no device, or tier.gpu.enable = off): enabled() is false, off_reason() says why, and
// every request is answered KDN_ERR_UNSUPPORTED with that reason.
//
// Not thread-safe: the event loop owns it. Namespaces and sessions it is given must outlive
// the batches that use them (the daemon keeps a namespace attached while a batch is in flight:
// ns.attached counts them).
#pragma once

#include "gpu_blend.h"
#include "gpu_layout.h"
#include "gpu_plan.h"
#include "gpu_registry.h"
#include "pinned_landings.h"
#include "t0_codec.h"
#include "t0_device_encode.h"
#include "t0_index.h"

#include "worker_pool.h"

#include "chunk_index.h"

#include <kdn/ipc/ops.h>
#include <kdn/ipc/protocol.h>
#include <kdn/kernels/layout.h>
#include <kdn/sidecar/config.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace kdn::sidecar {
struct Namespace;
struct Session;
class TieredStore;
}  // namespace kdn::sidecar

namespace kdn::sidecar::gpu {

struct SegmentPlacement;  // gpu_rope.h

struct GpuCounters {
  uint64_t registrations = 0, unregistrations = 0, stale_refused = 0, bounds_refused = 0;
  uint64_t retrieves = 0, retrieved_chunks = 0, stores = 0, stored_chunks = 0;
  uint64_t h2d_bytes = 0, d2h_bytes = 0, peer_chunks = 0, staged_chunks = 0;
  uint64_t batches_failed = 0;
  // tier.gpu.codec: blobs made for T0, chunks that could not be encoded (served from T1 instead),
  // chunks decoded on the device, and chunks whose decode failed on the device (their T0 copy
  // is dropped; the batch counts in batches_failed).
  uint64_t t0_encoded = 0, t0_encode_failed = 0, t0_decoded_chunks = 0, t0_decode_faults = 0;
  uint64_t t0_device_encoded = 0;  // chunks of GPU_STOREs encoded for T0 on the device (the rest on the host)
  uint64_t t0_raw_bytes_written = 0, t0_stored_bytes_written = 0;  // chunks encoded into T0, and their blobs
  uint64_t blend_selects = 0, blend_chunks = 0;  // GPU_BLEND_SELECTs queued and the chunks they compared
};

// What the daemon reports per device (GPU_INFO, TIER_STATS tier 0, metrics).
struct DeviceStats {
  DeviceInfo info;
  uint64_t peer_mask = 0;
  uint64_t t0_capacity = 0, t0_used = 0, t0_chunks = 0, t0_bytes = 0;
  T0Counters t0;
  // tier.gpu.codec: the chunks T0's blobs encode (their canonical size) and the blobs' own bytes.
  uint64_t t0_raw_bytes = 0, t0_stored_bytes = 0;
};

class GpuService {
 public:
  // Starts the tier from [tier.gpu]. kUnavailable (kdnd must not start) only for enable = "on"
  // without a usable device or when setting one up fails; otherwise a service that may be off.
  // `fail_retrieve` (a test build's fault seam, DaemonFaults): the N-th retrieve's batch lands
  // failed, as a copy that failed on the device would; 0 for none.
  static Result<std::unique_ptr<GpuService>> create(const GpuTierConfig& cfg, uint64_t fail_retrieve = 0);
  ~GpuService();

  bool enabled() const noexcept { return enabled_; }
  const std::string& off_reason() const noexcept { return off_reason_; }
  int wake_fd() const noexcept;  // -1 when off

  // Page-locks a namespace's host arena (tier.gpu.pin_host); undone by unpin_arena before it
  // is unmapped. Failure only logs: copies from pageable memory are slower, never wrong.
  void pin_arena(std::byte* base, uint64_t bytes) noexcept;
  void unpin_arena(std::byte* base) noexcept;

  // ---- requests (the handler has checked the SQE; records are kdnd's copies)
  Result<ipc::GpuRegisteredRecord> register_memory(const Session& s, const ipc::GpuRegisterRecord& rec);
  Status unregister(const Session& s, ipc::GpuRegistrationRef ref) noexcept;
  // A session ended: its registrations close once their copies land.
  void drop_session(uint64_t session) noexcept;
  // The registration a request names (kNotFound: stale or unknown) and its range for checks.
  Result<Registration*> find(const Session& s, ipc::GpuRegistrationRef ref) noexcept;
  static RegisteredRange range_of(const Registration& r) noexcept {
    return RegisteredRange{r.engine_base, r.bytes, r.mapping_base};
  }
  // Queues the copies of `chunks` (host-resident, pinned by the caller with one lease each)
  // into the registration, chunk i to tokens [i*T, (i+1)*T) of the layout, then records the
  // done event. Returns how many came from a T0 copy. Takes the pins over in every case: they
  // are released when the batch lands (or at once if nothing could be queued).
  // With `segment` (GPU_SEGMENT_RETRIEVE), chunk i starts at segment->first_token[i] of the
  // layout instead and its K is rotated by its table row (rope_scatter; row -1: scatter).
  Result<uint32_t> retrieve(Namespace& ns, Registration& reg, const CheckedLayout& layout,
                            const kernels::ChunkGeometry& geo, std::span<Entry* const> chunks,
                            const SegmentPlacement* segment = nullptr);
  // Queues, after the engine event, the gathers of reserved chunks (chunk_pos[i]: its index in
  // the layout) into their host slots; `op_token` is returned by poll() when they landed (with
  // failed set if they did not). The reservations stay the caller's.
  Status store(Namespace& ns, Registration& reg, const CheckedLayout& layout, const kernels::ChunkGeometry& geo,
               std::span<Entry* const> reserved, std::span<const uint32_t> chunk_pos, uint64_t op_token);

  // GPU_BLEND_SELECT: queues, after the engine event, the comparison of the engine's rows of the
  // plan's check layer with kdnd's copy of each of `chunks` (host-resident, leased by the caller,
  // one per plan chunk and placement row; K re-rotated by its row), the selection and the copy of
  // the answer to the host. `op_token` comes back through poll() once it landed; take_blend()
  // then gives the selected layout tokens. Takes the pins over in every case. Returns how many
  // chunks were read from T0.
  Result<uint32_t> blend_select(Namespace& ns, Registration& reg, const CheckedLayout& layout,
                                const kernels::ChunkGeometry& geo, std::span<Entry* const> chunks,
                                const SegmentPlacement& placement, BlendPlan plan, uint64_t op_token);
  // The answer of the GPU_BLEND_SELECT woken with `op_token` (once; kNotFound after).
  Result<std::vector<int32_t>> take_blend(uint64_t op_token);

  // GPU_PREFETCH: queues a copy into a fresh T0 slot of the registration's device for each of
  // `chunks` (host-resident, leased by the caller) without a T0 copy there (with a T0 codec,
  // their encoding); stops at a T0 full of pinned slots. Takes the pins over in every case.
  // kUnsupported without T0 on that device.
  struct Prefetched {
    uint32_t queued = 0, resident = 0;
  };
  Result<Prefetched> prefetch(Namespace& ns, Registration& reg, const kernels::ChunkGeometry& geo,
                              std::span<Entry* const> chunks);

  // GPU_CHECK: the ticket of the batch the last retrieve queued (0 before any).
  uint64_t last_ticket() const noexcept { return next_token_ - 1; }
  // What became of registration `reg`'s batches with tickets in [first, last]: kOk (all landed
  // whole), kFailed (one failed), kWait (*wait_on: the newest still in flight; wait_batch on it
  // and ask again), kTooOld (before what kdnd remembers failures for), kInvalid (empty range or
  // a ticket not issued yet).
  enum class Tickets : uint8_t { kOk, kFailed, kWait, kTooOld, kInvalid };
  Tickets check_tickets(const Registration& reg, uint64_t first, uint64_t last, uint64_t* wait_on) const noexcept;
  // Wakes `op_token` through poll() when batch `ticket` lands (false: it already has).
  bool wait_batch(uint64_t ticket, uint64_t op_token);

  // Applies landed batches; appends {op_token, failed} of GPU_STORE and GPU_BLEND_SELECT batches,
  // and of the GPU_CHECKs waiting for a batch, to `wake`.
  struct Woken {
    uint64_t op_token;
    bool failed;
  };
  void poll(std::vector<Woken>* wake);
  bool busy() const noexcept { return !batches_.empty() || encodes_in_flight_ > 0 || !encode_backlog_.empty(); }
  // tier.gpu.codec: after the GPU_STORE `op_token` committed `keys` (chunks of geometry `geo`),
  // they enter the T0 of the device of registration `ref`: as the blobs the device made while the
  // store's copies ran (checked on worker threads), or, for chunks it did not encode (lossless,
  // a chunk too large for the bounce buffer), encoded on worker threads from their T1 copy.
  // Nothing without a codec or when the registration is gone; the store's landings go in any case.
  void encode_stored(const Session& s, ipc::GpuRegistrationRef ref, Namespace& ns, const kernels::ChunkGeometry& geo,
                     std::span<const kdn_key> keys, uint64_t op_token);
  // kdnd is stopping: chunks not yet encoded for T0 are not (the backlog goes, queued jobs end
  // without encoding), so busy() turns false soon.
  void stop_encoding() noexcept;
  // The T0 codec ("none", "lossless", "int8", "kivi4").
  const std::string& t0_codec() const noexcept { return cfg_.codec; }
  uint8_t t0_codec_id() const noexcept { return codec_id_; }  // 0 none, 1 lossless, 2 int8, 3 kivi4
  // TIER_STATS tier 0 with a T0 codec: the codec, the canonical and blob bytes encoded into T0,
  // the chunks whose blob failed to decode on a device; resident_bytes becomes canonical bytes.
  void t0_codec_stats(ipc::TierStatsRecord* r) const noexcept;
  // Whether any device's T0 holds a chunk (LOOKUP asks holds() only then).
  bool holds_any() const noexcept;
  // Whether some device's T0 has a findable copy of `e`, a chunk of the namespace whose arena is
  // region `region` (LOOKUP then reports it in tier 0).
  bool holds(uint32_t region, const Entry& e) const noexcept;

  // ---- reporting
  std::vector<DeviceStats> device_stats() const;
  size_t device_count() const noexcept { return devices_.size(); }
  size_t registrations() const noexcept { return registry_ ? registry_->live() : 0; }
  const GpuCounters& counters() const noexcept { return counters_; }
  // The pinned buffers device encodes land in (zeros before the service started).
  LandingStats landing_stats() const { return landings_ ? landings_->stats() : LandingStats{}; }
  GpuCounters& counters() noexcept { return counters_; }
  uint64_t slice_bytes() const noexcept { return cfg_.slice_bytes; }

 private:
  struct Device;
  struct Batch;
  GpuService(const GpuTierConfig& cfg, uint64_t fail_retrieve);
  Status start();
  Status open_device(int ordinal, Device& d);
  void close(Registration& r) noexcept;
  Result<void*> open_memory(const Session& s, const ipc::GpuRegisterRecord& rec, int device);
  // Stages layout metadata for a batch on device d; fills the device-side view.
  // `tail` (a segment's RoPE table, a blend's table, mask and answer room) is staged after it in
  // the same allocation; *tail_dev and *tail_host get its device and pinned host addresses.
  Result<kernels::EngineView> stage_layout(Device& d, const CheckedLayout& layout, std::span<const std::byte> tail = {},
                                           std::byte** tail_dev = nullptr, std::byte** tail_host = nullptr);
  // The chunk's copy into the engine's blocks: scatter, or rope_scatter with its table row.
  Status scatter_chunk(const Device& d, const void* src, const kernels::ChunkGeometry& geo, kernels::EngineView v,
                       size_t i, const SegmentPlacement* segment, const float* table_dev) noexcept;
  Status copy_sliced(void* dst, const void* src, uint64_t bytes, void* stream) noexcept;
  Status ensure_peer(int engine_device, int t0_device) noexcept;
  // Ends a batch whose queueing failed after work was queued: synchronizes the stream and
  // feeds the token to the queue by hand, so completion order is kept.
  void finish_queued(Device& d, uint64_t token, Status why) noexcept;
  // A batch of `reg`'s copies, holding the pins of `leased` from here on.
  std::unique_ptr<Batch> new_batch(Namespace& ns, Registration& reg, std::span<Entry* const> leased);
  // Hands a queued batch to poll(); its registration and namespace stay in use until it lands.
  void start_batch(std::unique_ptr<Batch> b);
  void land(Batch& b, bool failed);

  // ---- T0 holding KVC1 blobs (tier.gpu.codec; gpu_service_codec.cc)
  using Encoders = WorkerPool<T0EncodeJob>;
  Status start_codec();
  // A retrieve's or a store's checks before anything is queued: the chunk fits the bounce buffer,
  // the device is current. A retrieve's caller unpins its chunks on failure.
  Status begin_copies(const Device& d, int device, uint64_t chunk_bytes) noexcept;
  Result<uint32_t> retrieve_coded(Namespace& ns, Registration& reg, const CheckedLayout& layout,
                                  const kernels::ChunkGeometry& geo, std::span<Entry* const> chunks);
  // Queues the decode of T0 hits[from, from + n) into the bounce buffer and their scatters.
  Status queue_decode_group(Device& d, Batch& b, const kernels::EngineView& view, const kernels::ChunkGeometry& geo,
                            const DecodeArea& area, std::span<Entry* const> chunks, uint32_t region,
                            std::span<const std::pair<uint32_t, uint64_t>> hits, uint32_t group);
  void encode_for_t0(Namespace& ns, int device, const kernels::ChunkGeometry& geo, Entry* e);
  bool post_encode(Namespace& ns, int device, const kernels::ChunkGeometry& geo, Entry* e);
  bool post_job(std::unique_ptr<T0EncodeJob> job);
  // ---- the device encodes a GPU_STORE's chunks for T0 (gpu_service_encode.cc)
  // The landing for a store of n chunks of geo, or null when they are encoded on the host.
  std::shared_ptr<StoreEncodes> begin_store_encodes(const Device& d, const kernels::ChunkGeometry& geo, uint32_t n,
                                                    uint64_t op_token);
  // After chunk i's gather into the bounce buffer: its encode there and the copies to its landing.
  Status queue_device_encode(Device& d, StoreEncodes& enc, uint32_t i, const T0Key& key, const kdn_key& fingerprint);
  void post_device_blob(Namespace& ns, int device, const std::shared_ptr<StoreEncodes>& enc, uint32_t i, Entry* e);
  void drain_encode_backlog();
  void poll_encodes();
  void fill_t0(Device& d, T0EncodeJob& job);
  bool coded_failed(Batch& b, bool failed) noexcept;  // reads a batch's decode results
  void drop_faulty(Batch& b) noexcept;

  uint8_t codec_id_ = 0;                // tier.gpu.codec as a tier codec id; 0: T0 holds raw chunks
  std::unique_ptr<Encoders> encoders_;  // first member destroyed in ~GpuService
  uint64_t encodes_in_flight_ = 0;
  // Chunks waiting for an encoder while kMaxEncodesInFlight run (each keeps its namespace attached).
  struct EncodeLater {
    Namespace* ns;
    int device;
    kernels::ChunkGeometry geo;
    kdn_key key;
    uint64_t generation;
  };
  std::deque<EncodeLater> encode_backlog_;
  // The pinned buffers device encodes land in, reused store after store (up to staging_bytes
  // of them kept idle). Shared: a T0 encode job on a worker may hold the last landing.
  std::shared_ptr<PinnedLandings> landings_;
  // GPU_STOREs whose device encodes are queued or landed, by op token, until encode_stored.
  std::unordered_map<uint64_t, std::shared_ptr<StoreEncodes>> store_encodes_;
  bool device_encode_logged_ = false;
  // Set by stop_encoding(); read by jobs on workers. Relaxed: a job that misses it only encodes
  // a chunk that is then dropped, and the loop sees its result through the pool's lock anyway.
  std::atomic<bool> encode_stop_{false};

  GpuTierConfig cfg_;
  bool enabled_ = false;
  std::string off_reason_;
  std::string off_status_;  // "GPU tier off: " + off_reason_, what refused requests carry (never changes)
  std::vector<std::unique_ptr<Device>> devices_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<GpuRegistry> registry_;
  struct Mapping {
    void* base = nullptr;
    uint32_t refs = 0;
  };
  std::unordered_map<std::string, Mapping> ipc_mappings_;  // device + handle bytes -> opened once
  std::unordered_map<uint64_t, std::unique_ptr<Batch>> batches_;
  std::unordered_map<uint64_t, Result<std::vector<int32_t>>> blend_answers_;  // by op token, until taken
  // Failed batches of registrations (ticket -> registration id | generation << 32), the newest
  // kMaxFailedTickets; tickets below failed_horizon_ may have failed unremembered.
  static constexpr size_t kMaxFailedTickets = 4096;
  std::map<uint64_t, uint64_t> failed_tickets_;
  uint64_t failed_horizon_ = 1;
  std::vector<std::byte*> pinned_arenas_;
  uint64_t next_token_ = 1;
  // Tests' fault seam (create's fail_retrieve): the N-th retrieve's batch lands failed.
  bool inject_failure() noexcept;
  uint64_t fail_retrieve_ = 0, retrieves_seen_ = 0;
  GpuCounters counters_;
};

}  // namespace kdn::sidecar::gpu
