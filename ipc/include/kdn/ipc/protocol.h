// The wire protocol between libkdn (the shim) and kdnd, version 2: handshake messages, the
// session segment, ring entries, opcodes and the wire records operations exchange.
// docs/protocol.md describes every byte in prose; this header is its executable form, and
// ops.h gives each opcode its typed request and response. Every struct here is plain old
// data with a fixed size and layout (static_asserts below), little-endian, no pointers.
//
// Wire records are not the ABI structs of kdn/kdn.h: the C ABI may grow its structs
// (struct_size) without moving a byte on the wire, and the wire may grow (proto_minor)
// without breaking the ABI. The shim converts between the two; only kdn_key, two u64s whose
// layout the ABI freezes, is used on both sides.
//
// Versioning: proto_major is KDN_PROTOCOL_VERSION from kdn/kdn.h. A peer of another major
// is refused at the handshake: every handshake message keeps magic and proto_major at the
// offsets version 1 had, and a refusal to another major is sent in the 80-byte version-1
// welcome layout, so a version-1 client reads "KDN_ERR_VERSION, daemon speaks 2". There is
// no dual stack. proto_minor grows with backward-compatible additions; an unknown opcode is
// answered with KDN_ERR_UNSUPPORTED.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/ring.h>
#include <kdn/kdn.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kdn::ipc {

// Four ASCII bytes read as a little-endian u32, so the bytes on the wire spell the name.
constexpr uint32_t fourcc(char a, char b, char c, char d) noexcept {
  return static_cast<uint32_t>(static_cast<uint8_t>(a)) | static_cast<uint32_t>(static_cast<uint8_t>(b)) << 8 |
         static_cast<uint32_t>(static_cast<uint8_t>(c)) << 16 | static_cast<uint32_t>(static_cast<uint8_t>(d)) << 24;
}

constexpr uint32_t kHelloMagic = fourcc('K', 'D', 'N', 'H');
constexpr uint32_t kWelcomeMagic = fourcc('K', 'D', 'N', 'W');
constexpr uint32_t kSessionMagic = fourcc('K', 'D', 'N', 'S');
constexpr uint16_t kProtocolMajor = KDN_PROTOCOL_VERSION;
// Minor 1: PREFETCH (16), TIER_STATS (17), EVICT mode kHost (the disk tier), STATS word 36
// (host_prefault_left_bytes), METRICS (20). Minor 2: LOOKUP_EACH (12) and LEASE_EACH (13)
// (segments, docs/blend.md). Minor 3: STATS words 37-39 (leases and their hits and misses),
// TierStatsRecord::lease_hit_chunks, LIST's ListRecordExt (arg1 = 1), RESERVE's chain
// position and head (arg0..arg2). Minor 4: the GPU tier — GPU_REGISTER (21), GPU_UNREGISTER
// (22), GPU_RETRIEVE (23), GPU_STORE (24), GPU_INFO (25) and their records (docs/gpu.md).
// Minor 5: GPU_BLEND_SELECT (14), the blend's selection run by kdnd on the device; GPU_CHECK (27)
// and the tickets GPU_RETRIEVE and GPU_SEGMENT_RETRIEVE answer in res2; GPU_PREFETCH (28).
constexpr uint16_t kProtocolMinor = 6;

// ---- limits ------------------------------------------------------------------------------
constexpr uint32_t kMinRingEntries = 16;
constexpr uint32_t kMaxRingEntries = 4096;
constexpr uint32_t kMinPayloadBytes = 4u << 10;
constexpr uint32_t kMaxPayloadBytes = 64u << 20;
constexpr uint32_t kMaxKeysPerOp = 65536;  // records of any kind in one SQE's input or output
constexpr uint64_t kMaxStagingBytes = 1ull << 40;
constexpr size_t kNameSpaceBytes = 64;  // including the NUL
constexpr size_t kTokenBytes = 64;      // including the NUL
constexpr size_t kPageBytes = 4096;

// ---- handshake (SOCK_SEQPACKET, one message each way) ---------------------------------------
// Hello flags: what the client asks for. The daemon grants by its configuration, never
// because a client asked; a flag not granted is simply absent from WelcomeMsg::flags.
constexpr uint32_t kHelloFlagAdmin = 1u << 0;            // LIST/EVICT and every counter of the namespace
constexpr uint32_t kHelloFlagCreateNamespace = 1u << 1;  // create the namespace if it does not exist
constexpr uint32_t kHelloKnownFlags = kHelloFlagAdmin | kHelloFlagCreateNamespace;

// Client -> daemon. Sent as exactly sizeof(HelloMsg) bytes with no fds.
struct HelloMsg {
  uint32_t magic;                    // kHelloMagic
  uint16_t proto_major;              // kProtocolMajor
  uint16_t proto_minor;              // the client's kProtocolMinor
  char name_space[kNameSpaceBytes];  // 1..63 bytes of [A-Za-z0-9._-], not starting with '.', NUL, zeros
  char token[kTokenBytes];           // 0..63 bytes, NUL, zeros
  uint32_t ring_entries;             // SQ and CQ capacity: power of two in [16, 4096]
  uint32_t payload_bytes;            // payload area: [4 KiB, 64 MiB], multiple of 4 KiB
  uint32_t client_pid;               // must equal the SO_PEERCRED pid
  uint32_t flags;                    // kHelloFlag*
  uint64_t staging_bytes;            // staging area to write stores into; 0 = none (read-only
                                     // session); a multiple of 4 KiB
  uint64_t reserved;                 // zero
};
static_assert(sizeof(HelloMsg) == 168 && alignof(HelloMsg) == 8);
static_assert(offsetof(HelloMsg, proto_major) == 4 && offsetof(HelloMsg, name_space) == 8);
static_assert(offsetof(HelloMsg, token) == 72 && offsetof(HelloMsg, ring_entries) == 136);
static_assert(offsetof(HelloMsg, flags) == 148 && offsetof(HelloMsg, staging_bytes) == 152);

// A region is memory that slot references point into: a namespace's host arena (clients map
// it read-only), a session's staging area (the session's own, read-write), and later GPU
// pools and engines' registered memory. Its generation is bumped whenever memory under the
// same id is created anew, so a reference to the old memory is refused.
enum class RegionKind : uint32_t { kHostArena = 1, kStaging = 2 };
enum class RegionAccess : uint32_t { kRead = 1, kReadWrite = 3 };

struct RegionRecord {
  uint32_t region_id;   // nonzero
  uint32_t generation;  // nonzero
  uint32_t kind;        // RegionKind
  uint32_t access;      // RegionAccess: how the client may (and can) map it
  uint64_t bytes;       // size of the mapping
  uint64_t reserved;    // zero
};
static_assert(sizeof(RegionRecord) == 32 && std::is_trivially_copyable_v<RegionRecord>);

// The per-session limits the daemon enforces (KDN_ERR_LIMIT beyond them), told to the client
// so it can size its requests.
struct SessionLimits {
  uint32_t max_leases;              // distinct chunks leased at once
  uint32_t max_lease_count;         // repeated leases of one chunk
  uint32_t max_reservations;        // open reservations
  uint32_t max_in_flight;           // requests being served at once
  uint32_t max_models;              // models registered
  uint32_t reservation_timeout_ms;  // an uncommitted reservation is aborted after this
  uint64_t max_lease_bytes;         // minor 6: bytes of the distinct chunks leased at once (0: not said)
};
static_assert(sizeof(SessionLimits) == 32 && std::is_trivially_copyable_v<SessionLimits>);

// Descriptors of a successful welcome, in order: [session segment, doorbell eventfd, then one
// per region in regions[] order].
constexpr uint32_t kMaxWelcomeRegions = 4;
constexpr uint32_t kWelcomeFdSession = 0;
constexpr uint32_t kWelcomeFdDoorbell = 1;
constexpr uint32_t kWelcomeFdFirstRegion = 2;
constexpr uint32_t kMaxWelcomeFds = kWelcomeFdFirstRegion + kMaxWelcomeRegions;

// Daemon -> client. Sent as exactly sizeof(WelcomeMsg) bytes on success. Bytes 0..11
// (magic, status, proto_major, proto_minor) have the version-1 layout.
struct WelcomeMsg {
  uint32_t magic;        // kWelcomeMagic
  int32_t status;        // KDN_OK (refusals: WelcomeRefusal)
  uint16_t proto_major;  // the daemon's version
  uint16_t proto_minor;
  uint32_t flags;                  // kHelloFlag* granted (subset of those asked for)
  uint64_t session_id;             // nonzero, unique for the daemon's lifetime
  uint64_t session_segment_bytes;  // == SessionLayout::total_bytes
  uint32_t ring_entries;           // == HelloMsg::ring_entries
  uint32_t payload_bytes;          // == HelloMsg::payload_bytes
  uint64_t sq_offset;              // == SessionLayout offsets (the client recomputes them)
  uint64_t cq_offset;
  uint64_t payload_offset;
  uint32_t num_fds;          // kWelcomeFdFirstRegion + num_regions
  uint32_t max_keys_per_op;  // kMaxKeysPerOp
  uint32_t num_regions;      // 1..kMaxWelcomeRegions
  uint32_t reserved0;
  RegionRecord regions[kMaxWelcomeRegions];  // [num_regions, 4) zero
  SessionLimits limits;
};
static_assert(sizeof(WelcomeMsg) == 240 && alignof(WelcomeMsg) == 8);
static_assert(offsetof(WelcomeMsg, status) == 4 && offsetof(WelcomeMsg, proto_major) == 8);
static_assert(offsetof(WelcomeMsg, session_id) == 16 && offsetof(WelcomeMsg, sq_offset) == 40);
static_assert(offsetof(WelcomeMsg, num_fds) == 64 && offsetof(WelcomeMsg, regions) == 80);
static_assert(offsetof(WelcomeMsg, limits) == 208);

// Daemon -> client: a refusal, in the layout of version 1's 80-byte welcome (so a client of
// any major reads it): status < 0, the daemon's proto_major/minor, zeros elsewhere, no fds.
struct WelcomeRefusal {
  uint32_t magic;  // kWelcomeMagic
  int32_t status;  // < 0
  uint16_t proto_major;
  uint16_t proto_minor;
  uint8_t zero[68];
};
static_assert(sizeof(WelcomeRefusal) == 80 && offsetof(WelcomeRefusal, proto_major) == 8);

// ---- session segment -----------------------------------------------------------------------
// One memfd per session, created and sized by the daemon, mapped MAP_SHARED by both:
//   [0, 4096)                SessionHeader
//   [sq_offset, +ring)       SQ ring: client produces Sqe, daemon consumes
//   [cq_offset, +ring)       CQ ring: daemon produces Cqe, client consumes
//   [payload_offset, +bytes) payload area, owned by the client
// Sections start on 4 KiB boundaries; the total is a multiple of 4 KiB.
struct SessionLayout {
  uint32_t ring_entries;
  uint32_t payload_bytes;
  uint64_t sq_offset;
  uint64_t cq_offset;
  uint64_t payload_offset;
  uint64_t total_bytes;

  // Offsets for validated parameters (KDN_ERR_INVALID_ARGUMENT if out of the limits above).
  static Result<SessionLayout> compute(uint32_t ring_entries, uint32_t payload_bytes) noexcept;
};

struct SessionHeader {
  // Written once by the daemon before the fd is sent; read-only afterwards. The client
  // checks them against the layout it computes itself.
  uint32_t magic;  // kSessionMagic
  uint16_t proto_major;
  uint16_t proto_minor;
  uint32_t ring_entries;
  uint32_t payload_bytes;
  uint64_t session_id;
  uint64_t segment_bytes;
  uint64_t sq_offset;
  uint64_t cq_offset;
  uint64_t payload_offset;
  uint8_t reserved0[8];
  // Daemon -> client: nonzero while the daemon is (about to be) asleep in epoll; a client
  // that publishes an SQE must then ring the doorbell eventfd. See doorbell.h.
  alignas(64) uint32_t need_wakeup;
  uint8_t pad_need_wakeup[60];
  // Client -> daemon: nonzero while the client is (about to be) asleep in futex_wait on the
  // CQ tail; the daemon must then futex_wake it after publishing a CQE.
  alignas(64) uint32_t cq_waiting;
  uint8_t pad_cq_waiting[60];
  uint8_t reserved1[kPageBytes - 192];
};
static_assert(sizeof(SessionHeader) == kPageBytes);
static_assert(offsetof(SessionHeader, need_wakeup) == 64 && offsetof(SessionHeader, cq_waiting) == 128);
static_assert(std::is_trivially_copyable_v<SessionHeader> && std::is_standard_layout_v<SessionHeader>);

// Fills a zeroed session header (daemon side).
void init_session_header(SessionHeader& header, const SessionLayout& layout, uint64_t session_id) noexcept;
// Checks a mapped session header against the layout and id from the welcome (client side).
Status check_session_header(const SessionHeader& header, const SessionLayout& layout, uint64_t session_id) noexcept;

// ---- ring entries ------------------------------------------------------------------------------
// The opcodes. What each takes and returns is declared once, in ops.h.
enum class Opcode : uint8_t {
  kPing = 1,
  kRegisterModel = 2,
  kLookup = 3,
  kReserve = 4,
  kCommit = 5,
  kAbort = 6,
  kLease = 7,
  kRelease = 8,
  kStats = 9,
  kList = 10,
  kEvict = 11,
  kLookupEach = 12,      // minor 2: per-key presence (segment lookups)
  kLeaseEach = 13,       // minor 2: per-key leases that do not stop at a miss (segment retrieves)
  kGpuBlendSelect = 14,  // minor 5: the tokens a blend recomputes, chosen on the device (docs/blend.md)
  // 15 is reserved for blending.
  kPrefetch = 16,   // minor 1
  kTierStats = 17,  // minor 1
  // 18..19 are reserved for the disk tier.
  kMetrics = 20,             // minor 1
  kGpuRegister = 21,         // minor 4: the GPU tier (docs/gpu.md)
  kGpuUnregister = 22,       // minor 4
  kGpuRetrieve = 23,         // minor 4
  kGpuStore = 24,            // minor 4
  kGpuInfo = 25,             // minor 4
  kGpuSegmentRetrieve = 26,  // minor 4: segment chunks re-positioned on the device
  kGpuCheck = 27,            // minor 5: did the copies behind a retrieve's tickets land whole?
  kGpuPrefetch = 28,         // minor 5: a cached prefix brought into T0 ahead of its retrieve
};
// Opcodes are numbered per feature; kMaxOpcode (ipc/ops.h) is the highest of them.

// SQE flags: none defined in 2.0; nonzero bits are a protocol error.
constexpr uint8_t kSqeKnownFlags = 0;

// Submission queue entry: client -> daemon.
struct Sqe {
  uint8_t opcode;      // Opcode
  uint8_t flags;       // kSqeKnownFlags
  uint16_t reserved;   // zero
  uint32_t model_id;   // from REGISTER_MODEL; for LOOKUP, RESERVE, LEASE
  uint64_t user_data;  // echoed in the CQE, never interpreted
  uint32_t in_off;     // input bytes: payload[in_off, in_off + in_len)
  uint32_t in_len;
  uint32_t out_off;  // output bytes: payload[out_off, out_off + out_len)
  uint32_t out_len;
  uint64_t arg[4];  // per-opcode scalars
};
static_assert(sizeof(Sqe) == 64 && alignof(Sqe) == 8 && std::is_trivially_copyable_v<Sqe>);
static_assert(offsetof(Sqe, user_data) == 8 && offsetof(Sqe, in_off) == 16 && offsetof(Sqe, arg) == 32);

// Completion queue entry: daemon -> client, exactly one per SQE, in completion order
// (which need not be submission order; match by user_data).
struct Cqe {
  uint64_t user_data;  // the SQE's
  int32_t status;      // kdn_status
  uint32_t flags;      // zero in 2.0
  uint64_t res[6];     // per-opcode results
};
static_assert(sizeof(Cqe) == 64 && alignof(Cqe) == 8 && std::is_trivially_copyable_v<Cqe>);
static_assert(offsetof(Cqe, status) == 8 && offsetof(Cqe, res) == 16);

// ---- wire records ------------------------------------------------------------------------------
// A place in a region: what RESERVE and LEASE hand out instead of bare offsets.
struct SlotRef {
  uint32_t region;      // RegionRecord::region_id
  uint32_t generation;  // must equal the region's, else the reference is stale
  uint64_t offset;      // byte offset inside the region
};
static_assert(sizeof(SlotRef) == 16 && std::is_trivially_copyable_v<SlotRef>);

// A model descriptor on the wire (REGISTER_MODEL's input): the fields of kdn_model_desc in a
// fixed order, without struct_size.
struct ModelRecord {
  uint32_t num_layers, num_kv_heads, head_dim, dtype, chunk_tokens, rope_style, rotary_dim;
  uint32_t rope_scaling, k_channel_order, tp_rank, tp_size, reserved;
  double rope_theta;
  float rope_scaling_params[4];
  char name[64];
  uint8_t engine_salt[32];
};
static_assert(sizeof(ModelRecord) == 168 && offsetof(ModelRecord, rope_theta) == 48);
static_assert(offsetof(ModelRecord, name) == 72 && offsetof(ModelRecord, engine_salt) == 136);

ModelRecord to_wire(const kdn_model_desc& desc) noexcept;
kdn_model_desc from_wire(const ModelRecord& record) noexcept;

enum class ReserveState : uint32_t {
  kNotServed = 0,      // the request stopped before this key (res2 says why); record is zero
  kReserved = 1,       // slot is yours to fill (in your staging region), then COMMIT or ABORT
  kAlreadyCached = 2,  // committed by someone: skip computing this chunk
  kInFlight = 3,       // another writer holds a reservation for it
};

struct ReserveRecord {
  SlotRef slot;             // the staging slot to write (kReserved only, else zero)
  uint64_t reservation_id;  // nonzero for kReserved, else 0
  uint32_t state;           // ReserveState
  uint32_t reserved;        // zero
};
static_assert(sizeof(ReserveRecord) == 32 && std::is_trivially_copyable_v<ReserveRecord>);

struct LeaseRecord {
  SlotRef slot;       // the chunk's canonical bytes, read-only (the namespace's arena)
  uint64_t lease_id;  // nonzero; the same id again for a chunk this session already leases
  uint32_t tier;      // the tier the chunk was served from (1 host; 0/2/3 promoted from)
  uint32_t reserved;  // zero
};
static_assert(sizeof(LeaseRecord) == 32 && std::is_trivially_copyable_v<LeaseRecord>);

enum class ChunkTier : uint8_t { kGpu = 0, kHost = 1, kDisk = 2, kRemote = 3 };
constexpr uint32_t kTierCount = 4;
// LOOKUP_EACH's output record for a key with no committed chunk of the model's size.
constexpr uint8_t kTierMiss = 0xFF;
enum class ChunkState : uint8_t { kReserved = 1, kCommitted = 2, kMoving = 3, kWriting = 4 };

struct ListRecord {
  kdn_key key;
  kdn_key fingerprint;  // the model's
  uint32_t model_id;    // the daemon's id of that model while one is registered, else 0
  uint8_t tier;         // ChunkTier of the fastest copy
  uint8_t state;        // ChunkState
  uint8_t tier_mask;    // bit t: a copy in tier t
  uint8_t reserved0;
  uint32_t leases;  // sessions holding a lease
  uint32_t reserved1;
  uint64_t bytes;        // stored bytes (compressed size on a compressed tier)
  uint64_t last_access;  // daemon CLOCK_MONOTONIC ns
};
static_assert(sizeof(ListRecord) == 64 && std::is_trivially_copyable_v<ListRecord>);

// Minor 3: LIST with ListOp::Args::extended writes these 128-byte records (two 64-byte output
// records each, so a daemon of any minor checks the output area the same way): the minor-0
// record, then the chunk's age and its place in a prefix chain. A daemon of an older minor
// ignores the flag and writes ListRecords.
struct ListRecordExt {
  ListRecord base;
  uint64_t created;      // daemon CLOCK_MONOTONIC ns when the key was reserved (or found on disk at start)
  kdn_key chain_head;    // the first key of the prefix chain it was stored in (zero: not known)
  uint32_t chain_pos;    // its position in that chain plus one (0: not known, e.g. a segment chunk)
  uint32_t reserved0;    // zero
  uint64_t now;          // daemon CLOCK_MONOTONIC ns when the page was made (ages: now - created)
  uint64_t reserved[3];  // zero
};
static_assert(sizeof(ListRecordExt) == 128 && std::is_trivially_copyable_v<ListRecordExt>);
static_assert(offsetof(ListRecordExt, created) == 64 && offsetof(ListRecordExt, chain_head) == 72 &&
              offsetof(ListRecordExt, chain_pos) == 88 && offsetof(ListRecordExt, now) == 96);

// STATS's output: the counters of the session's namespace; the daemon-wide ones only for
// admin sessions (zero otherwise). New counters are appended in later minors: a daemon
// writes min(sizeof(StatsRecord), out_len) bytes and says how many in res1.
struct StatsRecord {
  uint64_t lookups, lookup_hit_chunks, lookup_miss_chunks;
  uint64_t stored_chunks, stored_bytes;
  uint64_t retrieved_chunks, retrieved_bytes;
  uint64_t evicted_chunks, dropped_chunks, demoted_chunks, promoted_chunks;
  uint64_t resident_chunks[kTierCount], resident_bytes[kTierCount], capacity_bytes[kTierCount];
  uint64_t active_leases, open_reservations, in_flight_ops;
  uint64_t sessions, protocol_errors, limit_errors, corrupt_chunks, expired_reservations;
  uint64_t staging_bytes;
  // Daemon-wide, admin sessions only.
  uint64_t daemon_sessions, daemon_requests, daemon_handshakes_refused, daemon_namespaces;
  // The namespace's host arena bytes kdnd has still to pre-fault (0 once it is done).
  uint64_t host_prefault_left_bytes;
  // Minor 3: LEASE and LEASE_EACH requests that completed, the chunks they leased and those
  // they missed (lookups count LOOKUP and LOOKUP_EACH alone).
  uint64_t leases, lease_hit_chunks, lease_miss_chunks;
};
static_assert(sizeof(StatsRecord) == 8 * 40 && std::is_trivially_copyable_v<StatsRecord>);

enum class EvictMode : uint64_t {
  kAll = 0,     // every unleased chunk, from every tier
  kByKeys = 1,  // the keys given, from every tier
  kHost = 2,    // minor 1: every unleased chunk leaves the host tier for the tier below (written
                // down first where it has no copy there); nothing leaves the node
};

// TIER_STATS's output: one record per tier, in tier order (ChunkTier), for the session's
// namespace. A tier the namespace does not have reads present = 0 and zeros elsewhere.
// Device counters (reads..short_transfers) count operations on the device: a chunk write is
// a payload and a header. New counters replace `reserved` words in later minors.
struct TierStatsRecord {
  uint32_t tier;                             // ChunkTier
  uint32_t present;                          // 1: the namespace has this tier
  uint64_t capacity_bytes, used_bytes;       // the tier's own accounting (slots held)
  uint64_t resident_chunks, resident_bytes;  // chunks with a copy here (canonical bytes)
  uint64_t lookup_hit_chunks;                // lookup hits whose fastest copy was here
  uint64_t promoted_chunks, promoted_bytes;  // copies read from here into the host tier
  uint64_t demoted_chunks, demoted_bytes;    // copies written here as the tier above evicted them
  uint64_t written_through_chunks;           // copies written here at commit (write_through) or stop
  uint64_t reads, read_bytes, writes, write_bytes;
  uint64_t raw_bytes_written, stored_bytes_written;  // the codec's ratio is raw / stored
  uint64_t reencoded_chunks, pending_reencode;       // re-encoded by the background pass / waiting for it
  uint64_t fault_io, fault_no_space, fault_eof, fault_crc, fault_decode;  // faults by kind
  uint64_t retries, short_transfers;                                      // -EAGAIN resubmissions, short I/O continued
  uint64_t recovered_chunks;                                              // found on the device at start
  uint64_t in_flight, queue_depth;                                        // transfers in flight; the device queue depth
  uint64_t codec;             // the disk codec (0 none, 1 lossless, 2 int8, 3 kivi4)
  uint64_t flags;             // kTierStats* bits
  uint64_t lease_hit_chunks;  // minor 3: chunks leased from here (served, or promoted from)
};
static_assert(sizeof(TierStatsRecord) == 256 && std::is_trivially_copyable_v<TierStatsRecord>);
constexpr uint64_t kTierStatsFixedBuffers = 1u << 0;  // io_uring fixed buffers registered
constexpr uint64_t kTierStatsDegraded = 1u << 1;      // refusing writes after repeated failures

static_assert(sizeof(kdn_key) == 16 && std::is_trivially_copyable_v<kdn_key>);

// ---- minor 4: the GPU tier (docs/gpu.md) ----------------------------------------------------------
constexpr uint32_t kGpuHandleBytes = 64;                       // cudaIpcMemHandle_t, cudaIpcEventHandle_t
enum class GpuMemoryKind : uint32_t { kIpc = 1, kVmmFd = 2 };  // kdn_gpu_memory_kind

// GPU_REGISTER's input: kdn_gpu_kv_desc on the wire. A VMM registration names the exported fd
// by its number in the client process: kdnd takes its own copy with pidfd_getfd(2) from the
// client's pid (the SO_PEERCRED pid the handshake verified), so no descriptor crosses the ring.
struct GpuRegisterRecord {
  uint32_t kind;   // GpuMemoryKind
  int32_t vmm_fd;  // kVmmFd: the client's fd number; else -1
  uint8_t device_uuid[16];
  uint64_t engine_base;                   // the engine's address of the registered range's first byte
  uint64_t bytes;                         // the range's size
  uint64_t alloc_offset;                  // engine_base minus the base of the allocation the handle names
  uint64_t alloc_bytes;                   // that allocation's size
  uint8_t ipc_handle[kGpuHandleBytes];    // kIpc: cudaIpcGetMemHandle of the allocation's base
  uint8_t engine_event[kGpuHandleBytes];  // cudaIpcGetEventHandle of the engine's event
};
static_assert(sizeof(GpuRegisterRecord) == 184 && std::is_trivially_copyable_v<GpuRegisterRecord>);
static_assert(offsetof(GpuRegisterRecord, engine_base) == 24 && offsetof(GpuRegisterRecord, ipc_handle) == 56 &&
              offsetof(GpuRegisterRecord, engine_event) == 120);

// GPU_REGISTER's output: kdnd's done event (cudaIpcGetEventHandle of an interprocess event kdnd
// records after every GPU_RETRIEVE of the registration).
struct GpuRegisteredRecord {
  uint8_t done_event[kGpuHandleBytes];
  uint32_t registration;  // nonzero
  uint32_t generation;    // nonzero; requests must name both
  uint32_t device;        // kdnd's ordinal of the device
  uint32_t reserved;      // zero
};
static_assert(sizeof(GpuRegisteredRecord) == 80 && std::is_trivially_copyable_v<GpuRegisteredRecord>);

// A GPU_RETRIEVE / GPU_STORE layout: kdn_engine_layout with the engine's device addresses, as
// it travels in the payload area at the offset and length arg2 names (low / high 32 bits). It is
// followed by `layers` u64 K (or K|V) layer bases, `layers` u64 V bases if kGpuLayoutSplitV,
// then `tokens` i64 slots: the slot of every token of the request's chunks, in order (the client
// always sends a mapping; identity is written out). kdnd checks every address the layout can
// reach against the registration before it is used.
constexpr uint32_t kGpuLayoutSplitV = 1u << 0;
struct GpuLayoutRecord {
  uint32_t engine_dtype;  // kdn_dtype
  uint32_t flags;         // kGpuLayoutSplitV
  uint32_t layers;        // == the model's
  uint32_t tokens;        // slots that follow: chunks of the request * chunk_tokens
  int64_t stride_kv, stride_block, stride_offset, stride_head, stride_dim;
  int64_t block_size;
  int64_t v_stride_block, v_stride_offset, v_stride_head, v_stride_dim;
};
static_assert(sizeof(GpuLayoutRecord) == 96 && std::is_trivially_copyable_v<GpuLayoutRecord>);
constexpr uint32_t kGpuMaxLayoutBytes = 16u << 20;

// GPU_SEGMENT_RETRIEVE: where one chunk goes and how far its K moves, one record per key sent.
// `first_token` names the chunk's token 0 in the layout's slots (the chunk's T tokens are
// slots first_token .. first_token + T - 1; libkdn writes -1 for the rows of a partial last
// chunk past its segment's end). kGpuSegmentStart marks the first chunk of a segment: a chunk
// is copied only if it and every chunk since the last start (or since the request's first
// record) were cached.
constexpr uint32_t kGpuSegmentStart = 1u << 0;
struct GpuSegmentChunkRecord {
  int64_t delta;         // target position - base position; |delta| <= KDN_MAX_POSITION
  uint32_t first_token;  // first_token + chunk_tokens <= the layout's tokens
  uint32_t flags;        // kGpuSegmentStart; other bits zero
};
static_assert(sizeof(GpuSegmentChunkRecord) == 16 && offsetof(GpuSegmentChunkRecord, first_token) == 8 &&
              std::is_trivially_copyable_v<GpuSegmentChunkRecord>);
// Output byte of a chunk: copied or not (a miss, or after a miss of its segment).
constexpr uint8_t kGpuSegmentLoaded = 1;
constexpr uint8_t kGpuSegmentSkipped = 0;

// GPU_BLEND_SELECT: which rows of the check layer are compared (arg3 bits 16..17).
constexpr uint32_t kGpuBlendPlaneK = 0;
constexpr uint32_t kGpuBlendPlaneV = 1;
constexpr uint32_t kGpuBlendRatioOne = 1'000'000;  // recompute ratios travel in parts per million

// GPU_INFO's output: one record per visible device, with the peer matrix as a row of bits.
struct GpuDeviceRecord {
  uint32_t ordinal;
  uint32_t sm;    // major * 10 + minor
  char name[96];  // NUL-terminated
  uint8_t uuid[16];
  uint64_t memory_bytes;
  uint64_t peer_mask;  // bit j: this device can read device j's memory (cudaDeviceCanAccessPeer)
  uint64_t t0_capacity_bytes, t0_used_bytes, t0_chunks;
  uint32_t pci_domain, pci_bus, pci_device;
  uint32_t flags;  // kGpuDeviceVmm | kGpuDevicePosixFd
  uint64_t reserved[2];
};
static_assert(sizeof(GpuDeviceRecord) == 192 && std::is_trivially_copyable_v<GpuDeviceRecord>);
constexpr uint32_t kGpuDeviceVmm = 1u << 0;
constexpr uint32_t kGpuDevicePosixFd = 1u << 1;
constexpr uint32_t kGpuMaxDevices = 64;

// Name of an opcode for logs ("unknown" for anything else; never null).
const char* opcode_name(uint8_t opcode) noexcept;

}  // namespace kdn::ipc
