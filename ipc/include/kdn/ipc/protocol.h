// The wire protocol between libkdn (the shim) and kdnd: handshake messages, the session
// segment, ring entries, opcodes and their payload records. docs/protocol.md describes
// every byte in prose; this header is its executable form. Every struct here is plain old
// data with a fixed size and layout (static_asserts below), little-endian, no pointers.
//
// Versioning: proto_major is KDN_PROTOCOL_VERSION from kdn/kdn.h; a different major is
// refused at the handshake. proto_minor grows with backward-compatible additions (new
// opcodes, new flag bits, meaning given to reserved fields that were zero); both sides
// tolerate any minor and an unknown opcode is answered with KDN_ERR_UNSUPPORTED.
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
  return static_cast<uint32_t>(static_cast<uint8_t>(a)) |
         static_cast<uint32_t>(static_cast<uint8_t>(b)) << 8 |
         static_cast<uint32_t>(static_cast<uint8_t>(c)) << 16 |
         static_cast<uint32_t>(static_cast<uint8_t>(d)) << 24;
}

constexpr uint32_t kHelloMagic = fourcc('K', 'D', 'N', 'H');
constexpr uint32_t kWelcomeMagic = fourcc('K', 'D', 'N', 'W');
constexpr uint32_t kSessionMagic = fourcc('K', 'D', 'N', 'S');
constexpr uint16_t kProtocolMajor = KDN_PROTOCOL_VERSION;
constexpr uint16_t kProtocolMinor = 0;

// ---- limits ------------------------------------------------------------------------------
constexpr uint32_t kMinRingEntries = 16;
constexpr uint32_t kMaxRingEntries = 4096;
constexpr uint32_t kMinPayloadBytes = 4u << 10;
constexpr uint32_t kMaxPayloadBytes = 64u << 20;
constexpr uint32_t kMaxKeysPerOp = 65536;  // records of any kind in one SQE's input or output
constexpr size_t kNameSpaceBytes = 64;     // including the NUL
constexpr size_t kTokenBytes = 64;         // including the NUL
constexpr size_t kPageBytes = 4096;

// ---- handshake (SOCK_SEQPACKET, one message each way) ---------------------------------------
// Hello flags.
constexpr uint32_t kHelloFlagAdmin = 1u << 0;  // ask for admin opcodes (LIST, EVICT)
constexpr uint32_t kHelloKnownFlags = kHelloFlagAdmin;

// Client -> daemon. Sent as exactly sizeof(HelloMsg) bytes with no fds.
struct HelloMsg {
  uint32_t magic;                // kHelloMagic
  uint16_t proto_major;          // kProtocolMajor
  uint16_t proto_minor;          // the client's kProtocolMinor
  char name_space[kNameSpaceBytes];  // 1..63 bytes of [A-Za-z0-9._-], not starting with '.', NUL, zeros
  char token[kTokenBytes];       // 0..63 bytes, NUL, zeros
  uint32_t ring_entries;         // SQ and CQ capacity: power of two in [16, 4096]
  uint32_t payload_bytes;        // payload area: [4 KiB, 64 MiB], multiple of 4 KiB
  uint32_t client_pid;           // must equal the SO_PEERCRED pid
  uint32_t flags;                // kHelloFlag*
};
static_assert(sizeof(HelloMsg) == 152 && alignof(HelloMsg) == 4);
static_assert(offsetof(HelloMsg, name_space) == 8 && offsetof(HelloMsg, token) == 72);
static_assert(offsetof(HelloMsg, ring_entries) == 136 && offsetof(HelloMsg, flags) == 148);

// Daemon -> client. Sent as exactly sizeof(WelcomeMsg) bytes. With status == KDN_OK it
// carries num_fds == 3 descriptors, in order: [session segment memfd, namespace host arena
// memfd, doorbell eventfd]. With status < 0 every other field is zero except proto_major/
// proto_minor (the daemon's version), no fds travel and the daemon closes the socket.
constexpr uint32_t kWelcomeFds = 3;
constexpr uint32_t kWelcomeFdSession = 0;
constexpr uint32_t kWelcomeFdArena = 1;
constexpr uint32_t kWelcomeFdDoorbell = 2;

struct WelcomeMsg {
  uint32_t magic;                  // kWelcomeMagic
  int32_t status;                  // kdn_status
  uint16_t proto_major;            // the daemon's version
  uint16_t proto_minor;
  uint32_t flags;                  // kHelloFlag* granted (subset of those asked for)
  uint64_t session_id;             // nonzero, unique for the daemon's lifetime
  uint64_t session_segment_bytes;  // == SessionLayout::total_bytes
  uint64_t arena_bytes;            // size of the namespace's host arena segment
  uint32_t ring_entries;           // == HelloMsg::ring_entries
  uint32_t payload_bytes;          // == HelloMsg::payload_bytes
  uint64_t sq_offset;              // == SessionLayout offsets (the client recomputes them)
  uint64_t cq_offset;
  uint64_t payload_offset;
  uint32_t num_fds;                // kWelcomeFds on success, 0 on refusal
  uint32_t max_keys_per_op;        // kMaxKeysPerOp
};
static_assert(sizeof(WelcomeMsg) == 80 && alignof(WelcomeMsg) == 8);
static_assert(offsetof(WelcomeMsg, session_id) == 16 && offsetof(WelcomeMsg, sq_offset) == 48);
static_assert(offsetof(WelcomeMsg, num_fds) == 72);

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
  uint32_t magic;            // kSessionMagic
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
Status check_session_header(const SessionHeader& header, const SessionLayout& layout,
                            uint64_t session_id) noexcept;

// ---- ring entries ------------------------------------------------------------------------------
enum class Opcode : uint8_t {
  kPing = 1,           // no payload; res0 = arg0 echoed
  kRegisterModel = 2,  // in: kdn_model_desc; res0 = model_id, res1 = chunk_bytes,
                       //     res2 = chunk_tokens, res3/res4 = fingerprint lo/hi
  kLookup = 3,         // in: kdn_key[n]; res0 = hit_chunks, res1..res4 = chunks per tier 0..3
  kReserve = 4,        // in: kdn_key[n]; out: ReserveSlot[n]; res0 = slots in state kReserved
  kCommit = 5,         // in: u64 reservation_id[n]; res0 = committed
  kAbort = 6,          // in: u64 reservation_id[n]; res0 = aborted
  kLease = 7,          // in: kdn_key[n], arg0 = max chunks (0 = n); out: LeaseSlot[<= n];
                       //     res0 = leased (the longest present prefix)
  kRelease = 8,        // in: u64 lease_id[n]; res0 = released
  kStats = 9,          // out: kdn_stats
  kList = 10,          // admin; arg0 = cursor (0 = start); out: ListEntry[cap];
                       //     res0 = entries written, res1 = next cursor (0 = done)
  kEvict = 11,         // admin; arg0 = EvictMode; in: kdn_key[n] for kByKeys;
                       //     res0 = evicted, res1 = skipped (leased or reserved)
};
constexpr uint8_t kMaxOpcode = 11;

// SQE flags: none defined in 1.0; nonzero bits are a protocol error.
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
  uint32_t out_off;    // output bytes: payload[out_off, out_off + out_len)
  uint32_t out_len;
  uint64_t arg[4];     // per-opcode scalars
};
static_assert(sizeof(Sqe) == 64 && alignof(Sqe) == 8 && std::is_trivially_copyable_v<Sqe>);
static_assert(offsetof(Sqe, user_data) == 8 && offsetof(Sqe, in_off) == 16 && offsetof(Sqe, arg) == 32);

// Completion queue entry: daemon -> client, exactly one per SQE, in completion order
// (which need not be submission order; match by user_data).
struct Cqe {
  uint64_t user_data;  // the SQE's
  int32_t status;      // kdn_status
  uint32_t flags;      // zero in 1.0
  uint64_t res[6];     // per-opcode results
};
static_assert(sizeof(Cqe) == 64 && alignof(Cqe) == 8 && std::is_trivially_copyable_v<Cqe>);
static_assert(offsetof(Cqe, status) == 8 && offsetof(Cqe, res) == 16);

// ---- payload records ----------------------------------------------------------------------------
enum class ReserveState : uint32_t {
  kReserved = 1,       // slot at arena_off is yours to fill, then COMMIT or ABORT
  kAlreadyCached = 2,  // committed by someone: skip computing this chunk
  kInFlight = 3,       // another client holds a reservation for it
};

struct ReserveSlot {
  uint64_t arena_off;       // host arena offset of the slot (kReserved only, else 0)
  uint64_t reservation_id;  // nonzero for kReserved, else 0
  uint32_t state;           // ReserveState
  uint32_t reserved;        // zero
};
static_assert(sizeof(ReserveSlot) == 24 && std::is_trivially_copyable_v<ReserveSlot>);

struct LeaseSlot {
  uint64_t arena_off;  // host arena offset of the chunk's canonical bytes
  uint64_t lease_id;   // nonzero
};
static_assert(sizeof(LeaseSlot) == 16 && std::is_trivially_copyable_v<LeaseSlot>);

enum class ChunkTier : uint8_t { kGpu = 0, kHost = 1, kDisk = 2, kRemote = 3 };
enum class ChunkState : uint8_t { kReserved = 1, kCommitted = 2, kMoving = 3 };

struct ListEntry {
  kdn_key key;
  uint32_t model_id;     // the daemon's model id (stable for its lifetime)
  uint8_t tier;          // ChunkTier
  uint8_t state;         // ChunkState
  uint16_t reserved0;
  uint32_t leases;       // active leases
  uint32_t reserved1;
  uint64_t bytes;        // stored bytes (compressed size on a compressed tier)
  uint64_t last_access;  // daemon CLOCK_MONOTONIC ns
};
static_assert(sizeof(ListEntry) == 48 && std::is_trivially_copyable_v<ListEntry>);

enum class EvictMode : uint64_t { kAll = 0, kByKeys = 1 };

static_assert(sizeof(kdn_key) == 16 && std::is_trivially_copyable_v<kdn_key>);
static_assert(std::is_trivially_copyable_v<kdn_model_desc> && std::is_trivially_copyable_v<kdn_stats>);

// Name of an opcode for logs ("unknown" for anything else; never null).
const char* opcode_name(uint8_t opcode) noexcept;

}  // namespace kdn::ipc
