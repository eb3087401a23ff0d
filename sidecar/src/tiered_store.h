// TieredStore: one namespace's chunks across its tiers — the ChunkIndex, the tiers, and the
// TierPolicy, with the mechanics that tie them together: reserving host slots (evicting or
// demoting to make room), committing staged bytes into them, leasing (promoting from lower
// tiers), and applying the transfers' completions.
//
// Transfers are asynchronous. Each one that a request waits for carries the request's
// `waiter` token and a `cookie`; poll() reaps every tier, applies the completions to the
// index, and reports them as StoreEvents for the daemon to route back to the requests.
// Transfers nobody waits for (demotions that make room) report `room` instead, so requests
// waiting for space try again.
//
// Pins keep memory under transfers alive: an entry with `io` > 0 is never evicted or erased,
// and the caller keeps the host memory of a commit (a session's staging slot) mapped until
// its event arrives.
//
// Write policies with a tier below the host (T2): write_back writes a chunk down when the host
// tier evicts it (a demotion); write_through also writes it down as it is committed, and the
// COMMIT completes only once that write did, so a kdnd killed afterwards loses no committed
// chunk. Either way the host copy stays readable until the write lands.
//
// Not thread-safe: the daemon's event loop owns every TieredStore.
#pragma once

#include "chunk_index.h"
#include "tier_policy.h"

#include <kdn/common/model.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kdn::sidecar {

struct StoreEvent {
  uint64_t waiter = 0;  // the token given when the transfer started
  uint64_t cookie = 0;  // given with it (a commit: the staging offset)
  kdn_key key{};
  Status status;
  bool probe = false;  // a shared tier's probe ended (whatever it found is in the index now)
};

struct StoreOptions {
  // At most this many demotions out of one tier at once: making room never turns into
  // demoting the whole tier at once.
  uint32_t max_demotions = 32;
  // Commits are written down to the tier below the host too, and complete once that write did.
  bool write_through = false;
  // A demotion that fails (EIO, ENOSPC) drops the host copy it was making room for (the chunk
  // leaves the node, as without a lower tier), instead of keeping it.
  bool drop_on_failed_demotion = true;
  // With a shared tier (T3): committed chunks are uploaded to it as they are committed
  // (kThrough, the COMMIT does not wait for it), or as they leave host memory (kBack: with a
  // disk tier, once their demotion to it landed; without one, as the host tier's demotion).
  enum class Upload : uint8_t { kNone, kThrough, kBack } upload = Upload::kNone;
};

// The read paths that count hits and misses (kdn_hit_chunks_total{op}).
enum class ReadOp : uint8_t { kLookup, kLookupEach, kLease, kLeaseEach, kCount };
constexpr size_t kReadOps = size_t(ReadOp::kCount);
const char* read_op_name(ReadOp op) noexcept;  // "lookup", "lookup_each", "lease", "lease_each"

// Directions of tier_bytes: into a tier, and out of it.
enum class Flow : uint8_t { kIn = 0, kOut = 1 };

struct StoreCounters {
  // LOOKUP and LOOKUP_EACH requests, and the chunks they found or missed.
  uint64_t lookups = 0, lookup_hit_chunks = 0, lookup_miss_chunks = 0;
  // LEASE and LEASE_EACH requests that completed, the chunks they leased (a session's repeat
  // lease of a chunk it holds included) and those they did not find.
  uint64_t leases = 0, lease_hit_chunks = 0, lease_miss_chunks = 0;
  // Every read path: hits by the tier the chunk was found in (LOOKUP*: its fastest copy;
  // LEASE*: the host tier, or the tier its promotion came from) and misses, by operation.
  uint64_t hit_chunks[kReadOps][kTierCount] = {};
  uint64_t miss_chunks[kReadOps] = {};
  // Canonical bytes of copies that landed in a tier (commits and promotions into the host tier,
  // demotions and write-downs below it) and that left it (host: leased to engines, or copied
  // down; below: promoted up), by [tier][Flow].
  uint64_t tier_bytes[kTierCount][2] = {};
  uint64_t stored_chunks = 0, stored_bytes = 0;
  uint64_t retrieved_chunks = 0, retrieved_bytes = 0;
  uint64_t evicted_chunks = 0;  // copies that left a tier to make room
  uint64_t dropped_chunks = 0;  // chunks that left the namespace (no copy kept anywhere)
  uint64_t demoted_chunks = 0, promoted_chunks = 0;
  uint64_t demoted_bytes = 0, promoted_bytes = 0;
  uint64_t promoted_from_chunks[kTierCount] = {}, promoted_from_bytes[kTierCount] = {};  // by source tier
  uint64_t written_through_chunks = 0;  // copies written down at commit (write_through) or at stop
  uint64_t failed_demotions = 0;        // of which the host copy was dropped (drop_on_failed_demotion)
  uint64_t prefetched_chunks = 0;       // promotions started with nobody waiting (prefetch, read-ahead)
  uint64_t recovered_chunks = 0;        // adopted from a persistent tier at start
  uint64_t corrupt_chunks = 0;          // copies that failed their check: dropped, never served
  uint64_t transfer_errors = 0;         // transfers a tier failed (the data stayed where it was)
  uint64_t aborted_chunks = 0;
  // Shared tier (T3): probes on local misses, the keys they asked about and the chunks they
  // found (adopted into the index); uploads that landed and that failed.
  uint64_t remote_probes = 0, remote_probe_keys = 0, remote_found_chunks = 0, remote_failed_probes = 0;
  uint64_t uploaded_chunks = 0, failed_uploads = 0;
  uint64_t resident_chunks[kTierCount] = {}, resident_bytes[kTierCount] = {};
};

class TieredStore {
 public:
  explicit TieredStore(TierPolicy policy, StoreOptions options = {}) : policy_(std::move(policy)), options_(options) {}
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // ---- LOOKUP: leading keys committed with `bytes` bytes; tier_chunks[t] counts those whose
  // fastest copy is in tier t. (Counting is note_read's, once per request.)
  // `in_gpu` (may be null): whether a chunk also has a copy in the GPU tier, which then counts as
  // its fastest (T0 lives beside the store, in the GPU service).
  uint32_t lookup(std::span<const kdn_key> keys, uint64_t bytes, uint32_t tier_chunks[kTierCount],
                  const std::function<bool(const Entry&)>* in_gpu = nullptr) noexcept;
  // Counts one finished read request: its hits by tier and its misses (a request served in
  // slices counts once, at its end).
  void note_read(ReadOp op, const uint64_t hits[kTierCount], uint64_t misses) noexcept;
  // The same prefix count, counting nothing (PREFETCH).
  uint32_t cached_prefix(std::span<const kdn_key> keys, uint64_t bytes) const noexcept;
  // LOOKUP_EACH: the fastest tier holding a committed copy of `key` with `bytes` bytes, or
  // kTierCount if none.
  uint32_t probe(const kdn_key& key, uint64_t bytes) const noexcept;

  // ---- RESERVE one key. kNoSpace: the host tier is full of leased, reserved or moving
  // chunks; kInProgress: it will have room once demotions in flight land (try again after
  // the next event with room set); kInvalidArgument: the chunk can never fit.
  enum class ReserveOutcome : uint8_t { kReserved = 1, kAlreadyCached = 2, kInFlight = 3 };
  struct Reserved {
    ReserveOutcome outcome;
    Entry* entry;  // set for kReserved
  };
  Result<Reserved> reserve(const kdn_key& key, const kdn_key& fingerprint, uint64_t bytes, uint64_t session,
                           uint64_t now_ns);
  // Copies `bytes` staged at `src` into the reservation's host slot and publishes the chunk
  // when the copy lands (an event for `waiter`). `e` must be kReserved by its caller; if the
  // copy cannot start, the reservation is dropped (and `e` is gone). The
  // published chunk joins the host tier's eviction queue only at settle(): a request that
  // commits a chain settles it tail first, so the head of every prefix is the most recent
  // and eviction shortens documents from their ends (what stays is still a usable prefix).
  Status commit(Entry* e, const std::byte* src, uint64_t waiter, uint64_t cookie) noexcept;
  void settle(const kdn_key& key) noexcept;
  // Drops a reservation (kReserved).
  void abort(Entry* e) noexcept;

  // ---- LEASE one key. kLeased: the host copy is pinned (Entry::leases++); kMiss: no
  // committed chunk of that size; kPromoting: its copy is being brought into the host tier —
  // an event for `waiter` follows, then ask again; kNoRoomYet: it must be promoted but the
  // host tier has room only once demotions land — ask again after an event with room set.
  enum class Acquired : uint8_t { kLeased, kMiss, kPromoting, kNoRoomYet };
  // *from (if given) names the tier a promotion comes from.
  Acquired acquire(const kdn_key& key, uint64_t bytes, uint64_t waiter, Entry** out, uint64_t now_ns,
                   TierId* from = nullptr);
  // Starts promotions of the chunks behind `keys` whose copies sit only below the host tier
  // (read-ahead after a miss in the host tier), at most `limit`; returns how many started.
  uint32_t prefetch(std::span<const kdn_key> keys, uint64_t bytes, uint32_t limit) noexcept;
  // Marks chunks used now, in the order given: the last one touched is the most recent.
  void touch(Entry* e, uint64_t now_ns) noexcept;
  void unpin(Entry* e) noexcept;
  // Pins the host copy of a committed chunk for kdnd's own reading (the GPU tier encoding it for
  // T0), as a lease does but without counting a retrieve; undone by unpin(). False (nothing
  // pinned) when the chunk is not committed or has no host copy.
  bool pin_host_copy(Entry* e) noexcept;

  // ---- admin: drops every copy of unpinned committed chunks; returns how many chunks went.
  // Their copies in persistent tiers are discarded: a restart does not bring them back. The
  // shared tier's (T3) are only forgotten: the store keeps them for other nodes.
  bool evict(const kdn_key& key) noexcept;
  uint64_t evict_all() noexcept;
  // Makes every unleased committed chunk leave the host tier for the tier below: dropped at
  // once where a copy below exists, demoted otherwise (an event for `waiter` per demotion
  // when it lands). Returns {dropped now, demotions started}.
  std::pair<uint64_t, uint64_t> demote_all(uint64_t waiter) noexcept;

  // ---- the shared tier (T3)
  Tier* remote() const noexcept { return policy_.tier(TierId::kRemote); }
  // Asks the shared tier which of `keys` (chunks of `bytes` of model `fingerprint`) it holds;
  // those it does and the index lacks are adopted as committed chunks with their only copy
  // there (LOOKUP then reports them in T3, LEASE promotes them). One event with `probe` set
  // follows for `waiter`, whatever came of it (a failed probe finds nothing). kUnsupported
  // without a shared tier; kNotFound when every key is in the index already (no event).
  Status probe_remote(std::span<const kdn_key> keys, const kdn_key& fingerprint, uint64_t bytes,
                      uint64_t waiter) noexcept;

  // ---- persistence
  // A chunk a persistent tier found at start: committed, its only copy in tier t.
  // False (the placement is freed) when the key is already present.
  bool adopt(const kdn_key& key, const kdn_key& fingerprint, uint64_t bytes, TierId t, const Placement& placement,
             uint64_t now_ns) noexcept;
  // Starts writing down, to the tier below the host, committed chunks that have no copy there
  // (shutdown: nothing committed is lost to a restart); at most `limit`. Returns how many.
  uint64_t write_down(uint64_t limit) noexcept;
  // Committed chunks with a host copy and none below (what write_down has to write).
  uint64_t host_only_chunks() noexcept;

  // ---- transfers: applies every tier's completions; appends events; returns how many.
  // *room is set when copies left a tier (requests waiting for space may retry).
  size_t poll(std::vector<StoreEvent>& events, bool* room);
  uint64_t transfers_in_flight() const noexcept { return transfers_.size() + probes_.size(); }
  bool demotions_in_flight(TierId from) const noexcept;

  ChunkIndex& index() noexcept { return index_; }
  TierPolicy& policy() noexcept { return policy_; }
  const TierPolicy& policy() const noexcept { return policy_; }
  Tier* host() const noexcept { return policy_.tier(TierId::kHost); }
  const StoreCounters& counters() const noexcept { return counters_; }
  uint64_t open_reservations() const noexcept { return open_reservations_; }
  uint64_t active_leases() const noexcept { return active_leases_; }

 private:
  enum class Kind : uint8_t {
    kCommit,    // staging -> host slot
    kPromote,   // lower tier -> host
    kDemote,    // host -> lower tier, for eviction (the host copy may leave when it lands)
    kCopyDown,  // host -> lower tier, keeping the host copy (write_through, shutdown)
    kUpload,    // host -> shared tier, keeping the host copy unless it leaves for eviction
  };
  struct Record {
    Kind kind;
    Entry* entry;
    uint64_t generation;
    TierId tier;  // the tier that runs the transfer (the lower tier of a move)
    TierId from;  // the tier the bytes come from
    TierId to;    // the tier that gains the copy
    std::vector<uint64_t> waiters;
    uint64_t cookie;
  };
  struct ProbeState {
    uint64_t waiter = 0;
    uint64_t bytes = 0;
    std::vector<ChunkIdentity> chunks;
    std::vector<uint8_t> exists;
  };

  Result<Placement> allocate_with_room(TierId t, uint64_t bytes);
  enum class Evicted : uint8_t { kNone, kFreed, kDemoting };
  // Makes one copy of class `cls` (any class if none of it) leave tier t: freed at once
  // (dropped, or a copy below already exists), or demoting (freed when the write lands).
  Evicted evict_one(TierId t, uint16_t cls);
  // discard: the copy must not come back after a restart (damaged, or evicted by an operator).
  void drop_copy(Entry* e, TierId t, bool discard = false) noexcept;
  void erase_if_empty(Entry* e) noexcept;
  bool start_demotion(Entry* e, TierId from, TierId to, uint64_t waiter = 0);
  // Writes the host copy of `e` down to the tier below, keeping it; the record carries the
  // waiters given. False when it could not start (no tier below, no room there).
  bool start_copy_down(Entry* e, std::vector<uint64_t> waiters, uint64_t cookie);
  // Allocates in a lower tier, evicting there by its own rule when it is full.
  Result<Placement> allocate_below(TierId to, uint64_t bytes);
  std::optional<TierId> tier_below_host() const noexcept;
  // Uploads the host copy of `e` to the shared tier. for_eviction: the host copy leaves when it
  // lands (the upload counts as a demotion out of the host tier). False when it did not start.
  bool start_upload(Entry* e, bool for_eviction);
  // adopt()'s work, counting nothing.
  bool adopt_copy(const kdn_key& key, const kdn_key& fingerprint, uint64_t bytes, TierId t, const Placement& placement,
                  uint64_t now_ns) noexcept;
  void apply_probe(ProbeState& p, const Status& status, std::vector<StoreEvent>& events);
  // kOk, kInProgress (no room yet) or another error (no promotion).
  Status start_promotion(Entry* e, TierId from, uint64_t waiter);
  // Submits a transfer under a new id (0: not started, nothing changed).
  TransferId start(const Record& r, Transfer t) noexcept;
  void apply(const Record& r, const Status& status, std::vector<StoreEvent>& events, bool* room);
  void track_resident(TierId t, const Entry* e, int sign) noexcept;
  // A copy of `bytes` landed in `to` from `from` (from_staging: a commit, from no tier).
  void note_flow(TierId from, TierId to, uint64_t bytes, bool from_staging = false) noexcept;

  TierPolicy policy_;
  StoreOptions options_;
  ChunkIndex index_;
  std::unordered_map<TransferId, Record> transfers_;
  std::unordered_map<const Entry*, TransferId> promoting_;              // entry -> its promotion
  std::unordered_map<TransferId, std::unique_ptr<ProbeState>> probes_;  // shared-tier probes in flight
  TransferId next_transfer_ = 1;
  StoreCounters counters_;
  uint64_t open_reservations_ = 0, active_leases_ = 0;
  uint32_t demotions_[kTierCount] = {};  // demotions in flight out of each tier
};

}  // namespace kdn::sidecar
