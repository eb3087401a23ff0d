// Every opcode of the protocol in one place: what its payload holds (the shape check_sqe
// enforces), its scalar arguments in the SQE, its results in the CQE, and the encode/decode
// functions both sides use. The daemon, libkdn, kdnctl and the tests all go through these;
// nothing else interprets arg[] or res[].
//
// Each op is a struct with:
//   kOpcode, kName, kShape                    what check_sqe validates
//   InRecord / OutRecord                      payload record types (void: none)
//   Args   + put(Args, Sqe&) / args(Sqe)      the SQE's scalars (client encodes, daemon decodes)
//   Result + put(Result, Cqe&) / result(...)  the CQE's scalars (daemon encodes, client decodes;
//                                             the client's decode checks them against what it
//                                             asked, so a broken daemon is reported, not followed)
//
// Output records of a request that was served only in part (RESERVE stopped by a full arena,
// LEASE stopped at the first miss) are either valid or zero: the daemon zeroes the records it
// did not serve, up to what the request asked for.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/protocol.h>

#include <cstdint>
#include <span>

namespace kdn::ipc {

// What an opcode's payload must look like.
struct OpShape {
  enum class Out : uint8_t {
    kNone,       // no output allowed
    kPerInput,   // room for one record per input record (LEASE: per min(input, arg0 max))
    kAtLeastOne  // room for at least one record (STATS, LIST)
  };
  uint32_t in_record = 0;   // bytes per input record; 0 = no input allowed
  bool in_single = false;   // input is exactly one record (REGISTER_MODEL)
  uint32_t out_record = 0;  // bytes per output record
  Out out = Out::kNone;
  bool admin = false;  // needs a session granted kHelloFlagAdmin
};

// What serving an opcode needs beyond its payload, declared beside its shape: the daemon's
// checks, its dispatch and its teardown read these rather than lists of opcodes.
struct OpTraits {
  enum class Lease : uint8_t {
    kNone,    // takes no leases
    kPrefix,  // leases the longest cached prefix of a chain; the first miss ends it
    kEach,    // leases every key on its own; a miss does not stop it
  };
  enum class Holder : uint8_t {
    kSession,  // the leases are the client's (LeaseRecords out, RELEASE gives them back)
    kDaemon,   // kdnd holds them for its own copies and releases them when those land
  };
  bool model = false;  // Sqe::model_id names a model the session registered
  Lease lease = Lease::kNone;
  Holder holder = Holder::kSession;
  bool segment_records = false;      // arg1 names GpuSegmentChunkRecords, one per key
  bool settles_after_close = false;  // still finishes once its client is gone (copies it made)
};

// ---- PING: a round trip with no work -------------------------------------------------------------
struct PingOp {
  static constexpr Opcode kOpcode = Opcode::kPing;
  static constexpr const char* kName = "PING";
  static constexpr OpShape kShape{};
  struct Args {
    uint64_t cookie = 0;
  };
  struct Result {
    uint64_t cookie = 0;
  };
  static void put(const Args& a, Sqe& q) noexcept { q.arg[0] = a.cookie; }
  static Args args(const Sqe& q) noexcept { return {q.arg[0]}; }
  static void put(const Result& r, Cqe& c) noexcept { c.res[0] = r.cookie; }
  static kdn::Result<Result> result(const Cqe& c, const Args& asked) noexcept {
    if (c.res[0] != asked.cookie) return Status(Code::kProtocol, "PING echoed another cookie");
    return Result{c.res[0]};
  }
};

// ---- REGISTER_MODEL: one ModelRecord in; the daemon's id and geometry out ---------------------------
struct RegisterModelOp {
  static constexpr Opcode kOpcode = Opcode::kRegisterModel;
  static constexpr const char* kName = "REGISTER_MODEL";
  static constexpr OpShape kShape{sizeof(ModelRecord), true};
  using InRecord = ModelRecord;
  struct Args {};
  struct Result {
    uint32_t model_id = 0;  // nonzero; names this registration until the session ends
    uint64_t chunk_bytes = 0;
    uint32_t chunk_tokens = 0;
    kdn_key fingerprint{};
  };
  static void put(const Args&, Sqe&) noexcept {}
  static Args args(const Sqe&) noexcept { return {}; }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.model_id;
    c.res[1] = r.chunk_bytes;
    c.res[2] = r.chunk_tokens;
    c.res[3] = r.fingerprint.lo;
    c.res[4] = r.fingerprint.hi;
  }
  static kdn::Result<Result> result(const Cqe& c) noexcept {
    if (c.res[0] == 0 || c.res[0] > UINT32_MAX || c.res[2] > UINT32_MAX)
      return Status(Code::kProtocol, "REGISTER_MODEL answered an impossible id or geometry");
    return Result{uint32_t(c.res[0]), c.res[1], uint32_t(c.res[2]), kdn_key{c.res[3], c.res[4]}};
  }
};

// ---- LOOKUP: keys in; how many leading chunks are cached, and in which tiers ---------------------
struct LookupOp {
  static constexpr Opcode kOpcode = Opcode::kLookup;
  static constexpr const char* kName = "LOOKUP";
  static constexpr OpShape kShape{sizeof(kdn_key)};
  static constexpr OpTraits kTraits{.model = true};
  using InRecord = kdn_key;
  struct Args {
    uint32_t model_id = 0;
  };
  struct Result {
    uint32_t hit_chunks = 0;
    uint32_t tier_chunks[kTierCount] = {};  // of the hits, how many have their fastest copy in tier t
  };
  static void put(const Args& a, Sqe& q) noexcept { q.model_id = a.model_id; }
  static Args args(const Sqe& q) noexcept { return {q.model_id}; }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.hit_chunks;
    for (uint32_t t = 0; t < kTierCount; ++t) c.res[1 + t] = r.tier_chunks[t];
  }
  static kdn::Result<Result> result(const Cqe& c, uint32_t keys_sent) noexcept {
    if (c.res[0] > keys_sent) return Status(Code::kProtocol, "LOOKUP answered more hits than keys");
    Result r;
    r.hit_chunks = uint32_t(c.res[0]);
    uint64_t sum = 0;
    for (uint32_t t = 0; t < kTierCount; ++t) {
      if (c.res[1 + t] > keys_sent) return Status(Code::kProtocol, "LOOKUP answered an impossible tier count");
      r.tier_chunks[t] = uint32_t(c.res[1 + t]);
      sum += c.res[1 + t];
    }
    if (sum != c.res[0]) return Status(Code::kProtocol, "LOOKUP tier counts do not add up to the hits");
    return r;
  }
};

// ---- RESERVE: keys in; one ReserveRecord per key out ----------------------------------------------
// Records are served in order. A full arena (every candidate leased or being written) stops
// the request: the records not served are zero (state kNotServed) and `stop` says why, while
// the status stays KDN_OK if at least one record was served. A limit (open reservations,
// staging space) refuses the whole request with KDN_ERR_LIMIT and reserves nothing.
struct ReserveOp {
  static constexpr Opcode kOpcode = Opcode::kReserve;
  static constexpr const char* kName = "RESERVE";
  static constexpr OpShape kShape{sizeof(kdn_key), false, sizeof(ReserveRecord), OpShape::Out::kPerInput};
  static constexpr OpTraits kTraits{.model = true};
  using InRecord = kdn_key;
  using OutRecord = ReserveRecord;
  // Minor 3: where the keys sit in their prefix chain, for LIST (kdnctl ls): the position of
  // the first key plus one (0: not said; older clients, segments) and the chain's first key.
  struct Args {
    uint32_t model_id = 0;
    uint32_t chain_pos = 0;
    kdn_key chain_head{};
  };
  struct Result {
    uint32_t reserved = 0;  // records in state kReserved
    uint32_t served = 0;    // records written; [served, keys) are zero
    int32_t stop = 0;       // why the rest was not served (a kdn_status), 0 if all were
  };
  static void put(const Args& a, Sqe& q) noexcept {
    q.model_id = a.model_id;
    q.arg[0] = a.chain_pos;
    q.arg[1] = a.chain_head.lo;
    q.arg[2] = a.chain_head.hi;
  }
  static Args args(const Sqe& q) noexcept {
    return {q.model_id, q.arg[0] > UINT32_MAX ? 0 : uint32_t(q.arg[0]), kdn_key{q.arg[1], q.arg[2]}};
  }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.reserved;
    c.res[1] = r.served;
    c.res[2] = uint64_t(uint32_t(-r.stop));
  }
  static kdn::Result<Result> result(const Cqe& c, uint32_t keys_sent) noexcept {
    if (c.res[1] > keys_sent || c.res[0] > c.res[1] || c.res[2] > uint32_t(-KDN_ERR_LIMIT))
      return Status(Code::kProtocol, "RESERVE answered impossible counts");
    return Result{uint32_t(c.res[0]), uint32_t(c.res[1]), -int32_t(c.res[2])};
  }
};

// ---- COMMIT / ABORT / RELEASE: handle ids in; how many were finished ---------------------------------
// COMMIT copies each reserved slot from the session's staging area into the namespace's
// arena and publishes the chunk; it completes once every copy has. An id that is unknown
// (never issued, already finished, or expired after reservation_timeout_ms) is skipped and
// makes the status KDN_ERR_NOT_FOUND; `done` counts the others.
template <Opcode kOp>
struct HandleOp {
  static constexpr Opcode kOpcode = kOp;
  static constexpr const char* kName = kOp == Opcode::kCommit ? "COMMIT" : kOp == Opcode::kAbort ? "ABORT" : "RELEASE";
  static constexpr OpShape kShape{sizeof(uint64_t)};
  // A COMMIT settles the chunks its copies published even when its client is gone.
  static constexpr OpTraits kTraits{.settles_after_close = kOp == Opcode::kCommit};
  using InRecord = uint64_t;
  struct Args {};
  struct Result {
    uint32_t done = 0;
  };
  static void put(const Args&, Sqe&) noexcept {}
  static Args args(const Sqe&) noexcept { return {}; }
  static void put(const Result& r, Cqe& c) noexcept { c.res[0] = r.done; }
  static kdn::Result<Result> result(const Cqe& c, uint32_t ids_sent) noexcept {
    if (c.res[0] > ids_sent) return Status(Code::kProtocol, "more handles finished than sent");
    return Result{uint32_t(c.res[0])};
  }
};
using CommitOp = HandleOp<Opcode::kCommit>;
using AbortOp = HandleOp<Opcode::kAbort>;
using ReleaseOp = HandleOp<Opcode::kRelease>;

// ---- LEASE: keys in; one LeaseRecord per leased chunk of the longest cached prefix ---------------
// Chunks whose only copy sits in a slower tier are promoted into the host arena first; the
// request completes when they are there (other sessions are served meanwhile). A chunk this
// session already leases gets the same lease_id again (its count grows; release it as many
// times). Records past `leased`, up to min(keys, max_chunks), are zero.
struct LeaseOp {
  static constexpr Opcode kOpcode = Opcode::kLease;
  static constexpr const char* kName = "LEASE";
  static constexpr OpShape kShape{sizeof(kdn_key), false, sizeof(LeaseRecord), OpShape::Out::kPerInput};
  static constexpr OpTraits kTraits{.model = true, .lease = OpTraits::Lease::kPrefix};
  using InRecord = kdn_key;
  using OutRecord = LeaseRecord;
  struct Args {
    uint32_t model_id = 0;
    uint32_t max_chunks = 0;  // 0 = as many keys as sent
  };
  struct Result {
    uint32_t leased = 0;
  };
  static void put(const Args& a, Sqe& q) noexcept {
    q.model_id = a.model_id;
    q.arg[0] = a.max_chunks;
  }
  static Args args(const Sqe& q) noexcept {
    return {q.model_id, q.arg[0] > UINT32_MAX ? UINT32_MAX : uint32_t(q.arg[0])};
  }
  // Output records the request needs room for.
  static uint32_t wanted(const Args& a, uint32_t keys) noexcept {
    return a.max_chunks != 0 && a.max_chunks < keys ? a.max_chunks : keys;
  }
  static void put(const Result& r, Cqe& c) noexcept { c.res[0] = r.leased; }
  static kdn::Result<Result> result(const Cqe& c, uint32_t records_wanted) noexcept {
    if (c.res[0] > records_wanted) return Status(Code::kProtocol, "LEASE answered more chunks than asked");
    return Result{uint32_t(c.res[0])};
  }
};

// ---- STATS: counters out, as u64 words of a StatsRecord ------------------------------------------
struct StatsOp {
  static constexpr Opcode kOpcode = Opcode::kStats;
  static constexpr const char* kName = "STATS";
  static constexpr OpShape kShape{0, false, sizeof(uint64_t), OpShape::Out::kAtLeastOne};
  using OutRecord = uint64_t;
  struct Args {};
  struct Result {
    uint32_t words = 0;
  };  // u64 words of the StatsRecord written
  static void put(const Args&, Sqe&) noexcept {}
  static Args args(const Sqe&) noexcept { return {}; }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = 1;
    c.res[1] = r.words;
  }
  static kdn::Result<Result> result(const Cqe& c, uint32_t words_room) noexcept {
    if (c.res[1] > words_room || c.res[1] == 0) return Status(Code::kProtocol, "STATS wrote an impossible size");
    return Result{uint32_t(c.res[1])};
  }
};

// ---- LIST (admin): the namespace's chunks, a page at a time -------------------------------------
struct ListOp {
  static constexpr Opcode kOpcode = Opcode::kList;
  static constexpr const char* kName = "LIST";
  static constexpr OpShape kShape{0, false, sizeof(ListRecord), OpShape::Out::kAtLeastOne, true};
  using OutRecord = ListRecord;
  struct Args {
    uint64_t cursor = 0;    // 0 = from the start
    bool extended = false;  // minor 3: ListRecordExt, two output records each
  };
  struct Result {
    uint32_t written = 0;      // output records (ListRecordExt: twice the chunks)
    uint64_t next_cursor = 0;  // 0 = done
  };
  static void put(const Args& a, Sqe& q) noexcept {
    q.arg[0] = a.cursor;
    q.arg[1] = a.extended ? 1 : 0;
  }
  static Args args(const Sqe& q) noexcept { return {q.arg[0], q.arg[1] == 1}; }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.written;
    c.res[1] = r.next_cursor;
  }
  static kdn::Result<Result> result(const Cqe& c, uint32_t room) noexcept {
    if (c.res[0] > room) return Status(Code::kProtocol, "LIST wrote more records than fit");
    return Result{uint32_t(c.res[0]), c.res[1]};
  }
};

// ---- EVICT (admin): drop unleased chunks of the namespace from every tier --------------------------
// kHost (minor 1) instead moves every unleased chunk out of the host tier into the tier below
// and completes once the writes that needed are done: `evicted` counts chunks that left the
// host tier, `skipped` those that could not (leased, moving, or the tier below refused them).
struct EvictOp {
  static constexpr Opcode kOpcode = Opcode::kEvict;
  static constexpr const char* kName = "EVICT";
  static constexpr OpShape kShape{sizeof(kdn_key), false, 0, OpShape::Out::kNone, true};
  using InRecord = kdn_key;
  struct Args {
    EvictMode mode = EvictMode::kAll;
  };  // kAll takes no keys
  struct Result {
    uint64_t evicted = 0;
    uint64_t skipped = 0;  // leased, or being written or moved
  };
  static void put(const Args& a, Sqe& q) noexcept { q.arg[0] = uint64_t(a.mode); }
  static Args args(const Sqe& q) noexcept { return {EvictMode(q.arg[0])}; }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.evicted;
    c.res[1] = r.skipped;
  }
  static kdn::Result<Result> result(const Cqe& c) noexcept { return Result{c.res[0], c.res[1]}; }
};

// ---- LOOKUP_EACH (minor 2): keys in; for every key, the tier of its fastest copy --------------------
// Unlike LOOKUP it does not stop at the first miss: a segment lookup asks for the chunks of
// several segments at once and gets a per-chunk hit map. Output record i is the ChunkTier of
// key i's fastest committed copy of the model's chunk size, or kTierMiss.
struct LookupEachOp {
  static constexpr Opcode kOpcode = Opcode::kLookupEach;
  static constexpr const char* kName = "LOOKUP_EACH";
  static constexpr OpShape kShape{sizeof(kdn_key), false, sizeof(uint8_t), OpShape::Out::kPerInput};
  static constexpr OpTraits kTraits{.model = true};
  using InRecord = kdn_key;
  using OutRecord = uint8_t;
  struct Args {
    uint32_t model_id = 0;
  };
  struct Result {
    uint32_t hit_chunks = 0;                // keys with a copy somewhere
    uint32_t tier_chunks[kTierCount] = {};  // of those, how many have their fastest copy in tier t
  };
  static void put(const Args& a, Sqe& q) noexcept { q.model_id = a.model_id; }
  static Args args(const Sqe& q) noexcept { return {q.model_id}; }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.hit_chunks;
    for (uint32_t t = 0; t < kTierCount; ++t) c.res[1 + t] = r.tier_chunks[t];
  }
  // Checks the counts against the records (the client's copy of the output) as well.
  static kdn::Result<Result> result(const Cqe& c, const uint8_t* records, uint32_t keys_sent) noexcept {
    Result r;
    uint64_t per_tier[kTierCount] = {}, hits = 0;
    for (uint32_t i = 0; i < keys_sent; ++i) {
      if (records[i] == kTierMiss) continue;
      if (records[i] >= kTierCount) return Status(Code::kProtocol, "LOOKUP_EACH answered an unknown tier");
      ++per_tier[records[i]];
      ++hits;
    }
    if (c.res[0] != hits) return Status(Code::kProtocol, "LOOKUP_EACH hit count does not match its records");
    for (uint32_t t = 0; t < kTierCount; ++t) {
      if (c.res[1 + t] != per_tier[t])
        return Status(Code::kProtocol, "LOOKUP_EACH tier counts do not match its records");
      r.tier_chunks[t] = uint32_t(per_tier[t]);
    }
    r.hit_chunks = uint32_t(hits);
    return r;
  }
};

// ---- LEASE_EACH (minor 2): keys in; one LeaseRecord per key, a zero record for a miss ---------------
// LEASE for keys that are not a chain: every key is served on its own (promoted from a slower
// tier like LEASE does), a miss does not stop the request, and its record is zero (lease_id
// 0). Limits as for LEASE; a limit refuses the whole request and leases nothing.
struct LeaseEachOp {
  static constexpr Opcode kOpcode = Opcode::kLeaseEach;
  static constexpr const char* kName = "LEASE_EACH";
  static constexpr OpShape kShape{sizeof(kdn_key), false, sizeof(LeaseRecord), OpShape::Out::kPerInput};
  static constexpr OpTraits kTraits{.model = true, .lease = OpTraits::Lease::kEach};
  using InRecord = kdn_key;
  using OutRecord = LeaseRecord;
  struct Args {
    uint32_t model_id = 0;
  };
  struct Result {
    uint32_t leased = 0;
  };  // records with a lease (nonzero lease_id)
  static void put(const Args& a, Sqe& q) noexcept { q.model_id = a.model_id; }
  static Args args(const Sqe& q) noexcept { return {q.model_id}; }
  static void put(const Result& r, Cqe& c) noexcept { c.res[0] = r.leased; }
  static kdn::Result<Result> result(const Cqe& c, uint32_t keys_sent) noexcept {
    if (c.res[0] > keys_sent) return Status(Code::kProtocol, "LEASE_EACH answered more leases than keys");
    return Result{uint32_t(c.res[0])};
  }
};

// ---- PREFETCH (minor 1): keys in; promotions of the cached prefix start, nothing waits -------------
// The leading committed chunks among the keys (the prefix LOOKUP would count) whose copies sit
// only below the host tier start their promotion into it, at most the daemon's
// prefetch_max_chunks and as far as the host tier has room; the request completes at once. A
// later LEASE finds them in the host tier, or waits for the promotions in flight.
struct PrefetchOp {
  static constexpr Opcode kOpcode = Opcode::kPrefetch;
  static constexpr const char* kName = "PREFETCH";
  static constexpr OpShape kShape{sizeof(kdn_key)};
  static constexpr OpTraits kTraits{.model = true};
  using InRecord = kdn_key;
  struct Args {
    uint32_t model_id = 0;
  };
  struct Result {
    uint32_t hit_chunks = 0;  // the cached prefix
    uint32_t started = 0;     // promotions started by this request
  };
  static void put(const Args& a, Sqe& q) noexcept { q.model_id = a.model_id; }
  static Args args(const Sqe& q) noexcept { return {q.model_id}; }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.hit_chunks;
    c.res[1] = r.started;
  }
  static kdn::Result<Result> result(const Cqe& c, uint32_t keys_sent) noexcept {
    if (c.res[0] > keys_sent || c.res[1] > c.res[0])
      return Status(Code::kProtocol, "PREFETCH answered impossible counts");
    return Result{uint32_t(c.res[0]), uint32_t(c.res[1])};
  }
};

// ---- TIER_STATS (minor 1): one TierStatsRecord per tier out -----------------------------------------
struct TierStatsOp {
  static constexpr Opcode kOpcode = Opcode::kTierStats;
  static constexpr const char* kName = "TIER_STATS";
  static constexpr OpShape kShape{0, false, sizeof(TierStatsRecord), OpShape::Out::kAtLeastOne};
  using OutRecord = TierStatsRecord;
  struct Args {};
  struct Result {
    uint32_t written = 0;
  };
  static void put(const Args&, Sqe&) noexcept {}
  static Args args(const Sqe&) noexcept { return {}; }
  static void put(const Result& r, Cqe& c) noexcept { c.res[0] = r.written; }
  static kdn::Result<Result> result(const Cqe& c, uint32_t room) noexcept {
    if (c.res[0] > room || c.res[0] > kTierCount)
      return Status(Code::kProtocol, "TIER_STATS wrote more records than fit");
    return Result{uint32_t(c.res[0])};
  }
};

// ---- METRICS (minor 1, admin): kdnd's Prometheus page, as text, out ------------------------------
// The whole page or nothing: a page larger than the output area is KDN_ERR_NO_SPACE with
// res1 = its size, so the client can ask again with room for it.
struct MetricsOp {
  static constexpr Opcode kOpcode = Opcode::kMetrics;
  static constexpr const char* kName = "METRICS";
  static constexpr OpShape kShape{0, false, 1, OpShape::Out::kAtLeastOne, /*admin=*/true};
  using OutRecord = char;
  struct Args {};
  struct Result {
    uint32_t written = 0;  // bytes of the page
    uint64_t needed = 0;   // the page's size (also on KDN_ERR_NO_SPACE)
  };
  static void put(const Args&, Sqe&) noexcept {}
  static Args args(const Sqe&) noexcept { return {}; }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.written;
    c.res[1] = r.needed;
  }
  static kdn::Result<Result> result(const Cqe& c, uint32_t room) noexcept {
    if (c.res[0] > room || c.res[0] != c.res[1]) return Status(Code::kProtocol, "METRICS answered impossible sizes");
    return Result{uint32_t(c.res[0]), c.res[1]};
  }
};

// ---- GPU_REGISTER (minor 4): one GpuRegisterRecord in; one GpuRegisteredRecord out ---------------
// KDN_ERR_UNSUPPORTED (with the reason in the log and kdnctl stats) from a kdnd whose GPU tier is
// off; KDN_ERR_LIMIT past tier.gpu.max_registrations.
struct GpuRegisterOp {
  static constexpr Opcode kOpcode = Opcode::kGpuRegister;
  static constexpr const char* kName = "GPU_REGISTER";
  static constexpr OpShape kShape{sizeof(GpuRegisterRecord), true, sizeof(GpuRegisteredRecord),
                                  OpShape::Out::kAtLeastOne};
  using InRecord = GpuRegisterRecord;
  using OutRecord = GpuRegisteredRecord;
  struct Args {};
  struct Result {
    uint32_t registration = 0, generation = 0, device = 0;
  };
  static void put(const Args&, Sqe&) noexcept {}
  static Args args(const Sqe&) noexcept { return {}; }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.registration;
    c.res[1] = r.generation;
    c.res[2] = r.device;
  }
  static kdn::Result<Result> result(const Cqe& c) noexcept {
    if (c.res[0] == 0 || c.res[0] > UINT32_MAX || c.res[1] == 0 || c.res[1] > UINT32_MAX || c.res[2] >= kGpuMaxDevices)
      return Status(Code::kProtocol, "GPU_REGISTER answered an impossible registration");
    return Result{uint32_t(c.res[0]), uint32_t(c.res[1]), uint32_t(c.res[2])};
  }
};

// A registration as requests name it: arg0 = registration | generation << 32.
struct GpuRegistrationRef {
  uint32_t registration = 0, generation = 0;
  uint64_t word() const noexcept { return uint64_t(registration) | uint64_t(generation) << 32; }
  static GpuRegistrationRef of(uint64_t w) noexcept { return {uint32_t(w), uint32_t(w >> 32)}; }
};

// ---- GPU_UNREGISTER (minor 4): no payload; arg0 names the registration ---------------------------
// Completes at once; kdnd closes its mappings once the copies in flight for it have landed.
struct GpuUnregisterOp {
  static constexpr Opcode kOpcode = Opcode::kGpuUnregister;
  static constexpr const char* kName = "GPU_UNREGISTER";
  static constexpr OpShape kShape{};
  struct Args {
    GpuRegistrationRef reg;
  };
  struct Result {};
  static void put(const Args& a, Sqe& q) noexcept { q.arg[0] = a.reg.word(); }
  static Args args(const Sqe& q) noexcept { return {GpuRegistrationRef::of(q.arg[0])}; }
  static void put(const Result&, Cqe&) noexcept {}
  static kdn::Result<Result> result(const Cqe&) noexcept { return Result{}; }
};

// Where a GPU request's layout sits in the payload area: arg2 = offset | length << 32.
struct GpuLayoutRef {
  uint32_t off = 0, len = 0;
  uint64_t word() const noexcept { return uint64_t(off) | uint64_t(len) << 32; }
  static GpuLayoutRef of(uint64_t w) noexcept { return {uint32_t(w), uint32_t(w >> 32)}; }
};

// ---- GPU_RETRIEVE (minor 4): keys in; the cached prefix is scattered into the registration ------
// Like LEASE (promotion from slower tiers included) but the chunks are leased by kdnd itself,
// copied into the engine's blocks on kdnd's stream, and released when the copies landed. The
// completion comes once the copies are queued; the registration's done event follows them.
// The layout's slots cover every key sent (keys * chunk_tokens).
struct GpuRetrieveOp {
  static constexpr Opcode kOpcode = Opcode::kGpuRetrieve;
  static constexpr const char* kName = "GPU_RETRIEVE";
  static constexpr OpShape kShape{sizeof(kdn_key)};
  static constexpr OpTraits kTraits{
      .model = true, .lease = OpTraits::Lease::kPrefix, .holder = OpTraits::Holder::kDaemon};
  using InRecord = kdn_key;
  struct Args {
    uint32_t model_id = 0;
    GpuRegistrationRef reg;
    uint32_t max_chunks = 0;  // 0 = as many as keys
    GpuLayoutRef layout;
  };
  struct Result {
    uint32_t loaded = 0;   // leading chunks whose copies were queued
    uint32_t from_t0 = 0;  // of those, served from a T0 copy
    uint64_t ticket = 0;   // minor 5: names the copies for GPU_CHECK (0: none queued)
  };
  static void put(const Args& a, Sqe& q) noexcept {
    q.model_id = a.model_id;
    q.arg[0] = a.reg.word();
    q.arg[1] = a.max_chunks;
    q.arg[2] = a.layout.word();
  }
  static Args args(const Sqe& q) noexcept {
    return {q.model_id, GpuRegistrationRef::of(q.arg[0]), q.arg[1] > UINT32_MAX ? UINT32_MAX : uint32_t(q.arg[1]),
            GpuLayoutRef::of(q.arg[2])};
  }
  static uint32_t wanted(const Args& a, uint32_t keys) noexcept {
    return a.max_chunks != 0 && a.max_chunks < keys ? a.max_chunks : keys;
  }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.loaded;
    c.res[1] = r.from_t0;
    c.res[2] = r.ticket;
  }
  static kdn::Result<Result> result(const Cqe& c, uint32_t wanted) noexcept {
    if (c.res[0] > wanted || c.res[1] > c.res[0])
      return Status(Code::kProtocol, "GPU_RETRIEVE answered impossible counts");
    if (c.res[0] == 0 && c.res[2] != 0) return Status(Code::kProtocol, "GPU_RETRIEVE answered a ticket for no copy");
    return Result{uint32_t(c.res[0]), uint32_t(c.res[1]), c.res[2]};
  }
};

// ---- GPU_STORE (minor 4): keys in; the engine's blocks of chunks not cached yet are stored -------
// kdnd waits for the registration's engine event on its stream, gathers each chunk that is not
// cached (nor being stored) into a host arena slot of its own, and completes once they are
// committed. Token t of key i is slot i * chunk_tokens + t of the layout.
struct GpuStoreOp {
  static constexpr Opcode kOpcode = Opcode::kGpuStore;
  static constexpr const char* kName = "GPU_STORE";
  static constexpr OpShape kShape{sizeof(kdn_key)};
  static constexpr OpTraits kTraits{.model = true, .settles_after_close = true};
  using InRecord = kdn_key;
  struct Args {
    uint32_t model_id = 0;
    GpuRegistrationRef reg;
    GpuLayoutRef layout;
  };
  struct Result {
    uint32_t stored = 0;  // chunks gathered and committed
    uint32_t cached = 0;  // chunks already cached or being stored by someone else
  };
  static void put(const Args& a, Sqe& q) noexcept {
    q.model_id = a.model_id;
    q.arg[0] = a.reg.word();
    q.arg[2] = a.layout.word();
  }
  static Args args(const Sqe& q) noexcept {
    return {q.model_id, GpuRegistrationRef::of(q.arg[0]), GpuLayoutRef::of(q.arg[2])};
  }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.stored;
    c.res[1] = r.cached;
  }
  static kdn::Result<Result> result(const Cqe& c, uint32_t keys_sent) noexcept {
    if (c.res[0] + c.res[1] > keys_sent) return Status(Code::kProtocol, "GPU_STORE answered impossible counts");
    return Result{uint32_t(c.res[0]), uint32_t(c.res[1])};
  }
};

// ---- GPU_SEGMENT_RETRIEVE (minor 4): segment chunk keys in; one byte per key out ----------------
// Like LEASE_EACH (a miss does not stop the request) with kdnd as the lessee, then, per segment,
// the leading cached chunks are scattered into the registration with K rotated by their record's
// delta (rope_scatter; delta 0 is a plain scatter), and the done event recorded after them.
// arg1 names kdn's GpuSegmentChunkRecords (one per key) as GpuLayoutRef names the layout.
// Output byte i: kGpuSegmentLoaded or kGpuSegmentSkipped.
struct GpuSegmentRetrieveOp {
  static constexpr Opcode kOpcode = Opcode::kGpuSegmentRetrieve;
  static constexpr const char* kName = "GPU_SEGMENT_RETRIEVE";
  static constexpr OpShape kShape{sizeof(kdn_key), false, 1, OpShape::Out::kPerInput};
  static constexpr OpTraits kTraits{
      .model = true, .lease = OpTraits::Lease::kEach, .holder = OpTraits::Holder::kDaemon, .segment_records = true};
  using InRecord = kdn_key;
  using OutRecord = uint8_t;
  struct Args {
    uint32_t model_id = 0;
    GpuRegistrationRef reg;
    GpuLayoutRef chunks;  // GpuSegmentChunkRecords: offset | length << 32
    GpuLayoutRef layout;
  };
  struct Result {
    uint32_t loaded = 0;   // chunks whose copies were queued
    uint32_t from_t0 = 0;  // of those, served from a T0 copy
    uint64_t ticket = 0;   // minor 5: names the copies for GPU_CHECK (0: none queued)
  };
  static void put(const Args& a, Sqe& q) noexcept {
    q.model_id = a.model_id;
    q.arg[0] = a.reg.word();
    q.arg[1] = a.chunks.word();
    q.arg[2] = a.layout.word();
  }
  static Args args(const Sqe& q) noexcept {
    return {q.model_id, GpuRegistrationRef::of(q.arg[0]), GpuLayoutRef::of(q.arg[1]), GpuLayoutRef::of(q.arg[2])};
  }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.loaded;
    c.res[1] = r.from_t0;
    c.res[2] = r.ticket;
  }
  // `out` holds the output bytes (one per key sent); they must agree with res0.
  static kdn::Result<Result> result(const Cqe& c, const uint8_t* out, uint32_t keys_sent) noexcept {
    if (c.res[0] > keys_sent || c.res[1] > c.res[0])
      return Status(Code::kProtocol, "GPU_SEGMENT_RETRIEVE answered impossible counts");
    uint64_t loaded = 0;
    for (uint32_t i = 0; i < keys_sent; ++i) {
      if (out[i] != kGpuSegmentLoaded && out[i] != kGpuSegmentSkipped)
        return Status(Code::kProtocol, "GPU_SEGMENT_RETRIEVE answered an unknown chunk state");
      loaded += out[i] == kGpuSegmentLoaded;
    }
    if (loaded != c.res[0]) return Status(Code::kProtocol, "GPU_SEGMENT_RETRIEVE count does not match its bytes");
    if (c.res[0] == 0 && c.res[2] != 0)
      return Status(Code::kProtocol, "GPU_SEGMENT_RETRIEVE answered a ticket for no copy");
    return Result{uint32_t(c.res[0]), uint32_t(c.res[1]), c.res[2]};
  }
  // The records' checks (kdnd's, on its copy): shape, known flags, deltas, and each chunk's
  // tokens inside the layout's `layout_tokens` slots.
  static Status check_chunks(std::span<const GpuSegmentChunkRecord> recs, uint32_t keys, uint32_t chunk_tokens,
                             uint64_t layout_tokens) noexcept {
    if (recs.size() != keys) return Status(Code::kInvalidArgument, "GPU_SEGMENT_RETRIEVE: one chunk record per key");
    for (const GpuSegmentChunkRecord& r : recs) {
      if ((r.flags & ~kGpuSegmentStart) != 0)
        return Status(Code::kInvalidArgument, "GPU_SEGMENT_RETRIEVE: unknown chunk flags");
      if (r.delta > KDN_MAX_POSITION || r.delta < -KDN_MAX_POSITION)
        return Status(Code::kInvalidArgument, "GPU_SEGMENT_RETRIEVE: position delta out of range");
      if (uint64_t(r.first_token) + chunk_tokens > layout_tokens)
        return Status(Code::kInvalidArgument, "GPU_SEGMENT_RETRIEVE: a chunk's tokens leave the layout");
    }
    return OkStatus();
  }
};

// ---- GPU_BLEND_SELECT (minor 5): segment chunk keys in; selected token indices out --------------
// The selection step of a blend (docs/blend.md) run by kdnd on the device: the engine has
// loaded its segments (GPU_SEGMENT_RETRIEVE) and run its check pass, which wrote fresh K and V
// of layer `check_layer` for the documents' tokens into its blocks, and recorded its engine
// event. kdnd waits for that event on its stream, then, for each cached chunk that a segment
// retrieve of the same records would copy, compares the engine's rows of that layer with its
// own copy of the chunk's rows (K re-rotated by the record's delta): KV deviation, then top-k
// of the candidates (the chunks' tokens whose slot is not -1) with
// k = recompute_count(candidates, ratio). Chunk records and layout as for GPU_SEGMENT_RETRIEVE;
// the output holds the selected tokens' indices in the layout's slots (int32, ascending) and
// must have room for k of them. Completes once the selection is back on the host.
struct GpuBlendSelectOp {
  static constexpr Opcode kOpcode = Opcode::kGpuBlendSelect;
  static constexpr const char* kName = "GPU_BLEND_SELECT";
  static constexpr OpShape kShape{sizeof(kdn_key), false, sizeof(int32_t), OpShape::Out::kAtLeastOne};
  static constexpr OpTraits kTraits{
      .model = true, .lease = OpTraits::Lease::kEach, .holder = OpTraits::Holder::kDaemon, .segment_records = true};
  using InRecord = kdn_key;
  using OutRecord = int32_t;
  struct Args {
    uint32_t model_id = 0;
    GpuRegistrationRef reg;
    GpuLayoutRef chunks;  // GpuSegmentChunkRecords
    GpuLayoutRef layout;
    uint32_t check_layer = 0;          // arg3 bits 0..15
    uint32_t plane = kGpuBlendPlaneK;  // arg3 bits 16..17 (kGpuBlendPlaneK or kGpuBlendPlaneV)
    uint32_t ratio_ppm = 0;            // arg3 bits 32..63: the recompute ratio in parts per million
  };
  struct Result {
    uint32_t selected = 0;    // indices written
    uint32_t candidates = 0;  // tokens compared
    uint32_t chunks = 0;      // chunks compared
    uint32_t from_t0 = 0;     // of those, read from a T0 copy
  };
  static void put(const Args& a, Sqe& q) noexcept {
    q.model_id = a.model_id;
    q.arg[0] = a.reg.word();
    q.arg[1] = a.chunks.word();
    q.arg[2] = a.layout.word();
    q.arg[3] = uint64_t(a.check_layer & 0xffffu) | uint64_t(a.plane & 3u) << 16 | uint64_t(a.ratio_ppm) << 32;
  }
  static Args args(const Sqe& q) noexcept {
    Args a{q.model_id, GpuRegistrationRef::of(q.arg[0]), GpuLayoutRef::of(q.arg[1]), GpuLayoutRef::of(q.arg[2])};
    a.check_layer = uint32_t(q.arg[3] & 0xffffu);
    a.plane = uint32_t(q.arg[3] >> 16) & 3u;
    a.ratio_ppm = uint32_t(q.arg[3] >> 32);
    return a;
  }
  // kdnd's checks of the scalars: bits nobody defined are zero, the layer exists, the plane and
  // the ratio are known.
  static Status check_args(const Sqe& q, uint32_t layers) noexcept {
    const Args a = args(q);
    if ((q.arg[3] & 0xfffc0000ull) != 0)
      return Status(Code::kInvalidArgument, "GPU_BLEND_SELECT: unknown bits in arg3");
    if (a.check_layer >= layers)
      return Status(Code::kInvalidArgument, "GPU_BLEND_SELECT: check layer past the model's layers");
    if (a.plane != kGpuBlendPlaneK && a.plane != kGpuBlendPlaneV)
      return Status(Code::kInvalidArgument, "GPU_BLEND_SELECT: plane is neither K nor V");
    if (a.ratio_ppm > kGpuBlendRatioOne) return Status(Code::kInvalidArgument, "GPU_BLEND_SELECT: ratio above 1");
    return OkStatus();
  }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.selected;
    c.res[1] = r.candidates;
    c.res[2] = r.chunks;
    c.res[3] = r.from_t0;
  }
  // `out` holds the indices written (res0 of them, room for `room`); each must be a slot index
  // of the layout (< layout_tokens), strictly ascending.
  static kdn::Result<Result> result(const Cqe& c, const int32_t* out, uint32_t room, uint32_t keys_sent,
                                    uint64_t layout_tokens) noexcept {
    if (c.res[0] > room || c.res[0] > c.res[1] || c.res[1] > layout_tokens || c.res[2] > keys_sent ||
        c.res[3] > c.res[2])
      return Status(Code::kProtocol, "GPU_BLEND_SELECT answered impossible counts");
    for (uint64_t i = 0; i < c.res[0]; ++i) {
      if (out[i] < 0 || uint64_t(out[i]) >= layout_tokens || (i > 0 && out[i] <= out[i - 1]))
        return Status(Code::kProtocol, "GPU_BLEND_SELECT answered a token outside the layout or out of order");
    }
    return Result{uint32_t(c.res[0]), uint32_t(c.res[1]), uint32_t(c.res[2]), uint32_t(c.res[3])};
  }
};

// ---- GPU_CHECK (minor 5): no payload; did the copies of tickets [first, last] land whole? ----------
// A retrieve's CQE comes once its copies are queued; its ticket (res2) names them. GPU_CHECK on
// the registration they were queued for completes once every batch of that registration with a
// ticket in [first, last] has landed: KDN_OK if all of them landed whole, KDN_ERR_IO if one
// failed (the engine's blocks then hold bytes kdnd did not write: recompute them), KDN_ERR_NOT_FOUND
// for tickets older than kdnd still remembers failures for, KDN_ERR_INVALID_ARGUMENT for a range
// that is empty or names tickets not issued yet.
struct GpuCheckOp {
  static constexpr Opcode kOpcode = Opcode::kGpuCheck;
  static constexpr const char* kName = "GPU_CHECK";
  static constexpr OpShape kShape{};
  struct Args {
    GpuRegistrationRef reg;
    uint64_t first = 0, last = 0;
  };
  struct Result {};
  static void put(const Args& a, Sqe& q) noexcept {
    q.arg[0] = a.reg.word();
    q.arg[1] = a.first;
    q.arg[2] = a.last;
  }
  static Args args(const Sqe& q) noexcept { return {GpuRegistrationRef::of(q.arg[0]), q.arg[1], q.arg[2]}; }
  static void put(const Result&, Cqe&) noexcept {}
  static kdn::Result<Result> result(const Cqe&) noexcept { return Result{}; }
};

// ---- GPU_PREFETCH (minor 5): keys in; the cached prefix is brought into T0 -----------------------
// Like GPU_RETRIEVE (the prefix leased by kdnd, promoted from T2/T3 into the host tier first) but
// nothing is copied into the engine: each chunk without a T0 copy on the registration's device
// is copied into a fresh T0 slot (with tier.gpu.codec: encoded on kdnd's workers and then
// copied), so a later retrieve reads it device to device. Completes once the copies are queued.
struct GpuPrefetchOp {
  static constexpr Opcode kOpcode = Opcode::kGpuPrefetch;
  static constexpr const char* kName = "GPU_PREFETCH";
  static constexpr OpShape kShape{sizeof(kdn_key)};
  static constexpr OpTraits kTraits{
      .model = true, .lease = OpTraits::Lease::kPrefix, .holder = OpTraits::Holder::kDaemon};
  using InRecord = kdn_key;
  struct Args {
    uint32_t model_id = 0;
    GpuRegistrationRef reg;
    uint32_t max_chunks = 0;  // 0 = as many as keys
  };
  struct Result {
    uint32_t cached = 0;    // leading chunks found (the prefix)
    uint32_t queued = 0;    // of those, copies (or encodes) into T0 queued
    uint32_t resident = 0;  // of those, already in T0 (or being filled)
  };
  static void put(const Args& a, Sqe& q) noexcept {
    q.model_id = a.model_id;
    q.arg[0] = a.reg.word();
    q.arg[1] = a.max_chunks;
  }
  static Args args(const Sqe& q) noexcept {
    return {q.model_id, GpuRegistrationRef::of(q.arg[0]), q.arg[1] > UINT32_MAX ? UINT32_MAX : uint32_t(q.arg[1])};
  }
  static uint32_t wanted(const Args& a, uint32_t keys) noexcept {
    return a.max_chunks != 0 && a.max_chunks < keys ? a.max_chunks : keys;
  }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.cached;
    c.res[1] = r.queued;
    c.res[2] = r.resident;
  }
  static kdn::Result<Result> result(const Cqe& c, uint32_t wanted) noexcept {
    if (c.res[0] > wanted || c.res[1] + c.res[2] > c.res[0])
      return Status(Code::kProtocol, "GPU_PREFETCH answered impossible counts");
    return Result{uint32_t(c.res[0]), uint32_t(c.res[1]), uint32_t(c.res[2])};
  }
};

// ---- GPU_INFO (minor 4): one GpuDeviceRecord per device out -------------------------------------
// Answered by every minor-4 kdnd: with the GPU tier off, `enabled` is 0 and no record is written.
struct GpuInfoOp {
  static constexpr Opcode kOpcode = Opcode::kGpuInfo;
  static constexpr const char* kName = "GPU_INFO";
  static constexpr OpShape kShape{0, false, sizeof(GpuDeviceRecord), OpShape::Out::kAtLeastOne};
  using OutRecord = GpuDeviceRecord;
  struct Args {};
  struct Result {
    uint32_t written = 0;        // records written
    uint32_t devices = 0;        // devices kdnd sees (may exceed written)
    uint32_t enabled = 0;        // 1: the GPU tier serves requests
    uint32_t registrations = 0;  // open registrations, all sessions
  };
  static void put(const Args&, Sqe&) noexcept {}
  static Args args(const Sqe&) noexcept { return {}; }
  static void put(const Result& r, Cqe& c) noexcept {
    c.res[0] = r.written;
    c.res[1] = r.devices;
    c.res[2] = r.enabled;
    c.res[3] = r.registrations;
  }
  static kdn::Result<Result> result(const Cqe& c, uint32_t room) noexcept {
    if (c.res[0] > room || c.res[0] > c.res[1] || c.res[1] > kGpuMaxDevices || c.res[2] > 1 || c.res[3] > UINT32_MAX)
      return Status(Code::kProtocol, "GPU_INFO answered impossible counts");
    return Result{uint32_t(c.res[0]), uint32_t(c.res[1]), uint32_t(c.res[2]), uint32_t(c.res[3])};
  }
};

// ---- every opcode ----------------------------------------------------------------------------------
// The one list of op structs: the shape table, the traits table, the daemon's dispatch and
// kMaxOpcode are all built from it. A new opcode is its struct, its place here, its handler
// and its tests.
template <class... Ops>
struct OpList {};
using AllOps =
    OpList<PingOp, RegisterModelOp, LookupOp, ReserveOp, CommitOp, AbortOp, LeaseOp, ReleaseOp, StatsOp, ListOp,
           EvictOp, LookupEachOp, LeaseEachOp, PrefetchOp, TierStatsOp, MetricsOp, GpuRegisterOp, GpuUnregisterOp,
           GpuRetrieveOp, GpuStoreOp, GpuInfoOp, GpuSegmentRetrieveOp, GpuBlendSelectOp, GpuCheckOp, GpuPrefetchOp>;

template <class... Ops>
constexpr uint8_t max_opcode(OpList<Ops...>) noexcept {
  uint8_t m = 0;
  ((m = uint8_t(Ops::kOpcode) > m ? uint8_t(Ops::kOpcode) : m), ...);
  return m;
}
// Opcodes are numbered per feature; a number without an op is answered with
// KDN_ERR_UNSUPPORTED like any unknown one.
constexpr uint8_t kMaxOpcode = max_opcode(AllOps{});

// An op's traits (none declared: it needs nothing beyond its payload).
template <class O>
constexpr OpTraits traits_of() noexcept {
  if constexpr (requires { O::kTraits; })
    return O::kTraits;
  else
    return OpTraits{};
}

// Output records a request must have room for: one per input record, or what its `wanted`
// says (LEASE with max_chunks).
template <class O>
constexpr uint32_t records_wanted(const Sqe& q, uint32_t in_records) noexcept {
  if constexpr (requires { O::wanted(O::args(q), in_records); })
    return O::wanted(O::args(q), in_records);
  else
    return in_records;
}

// The shape of `opcode`, or null for an unknown opcode (table built from AllOps).
const OpShape* op_shape(uint8_t opcode) noexcept;
// The traits of `opcode`, or null for an unknown opcode.
const OpTraits* op_traits(uint8_t opcode) noexcept;

}  // namespace kdn::ipc
