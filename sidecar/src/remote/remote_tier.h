// RemoteTier: T3, one namespace's chunks in a store the operator already runs — a standalone
// Redis/Valkey server or a Redis Cluster — over kdn's own RESP client (redis_conn.h).
// docs/remote.md has the value format and the fault mapping.
//
// Placements. A placement's offset is a handle into this tier's slot table (index and
// generation, so a stale placement is refused); a slot holds the chunk's key and fingerprint,
// its Redis key (which names the namespace) and the bytes stored. The store itself is not
// accounted by size class: capacity_bytes is this node's own budget, and the store may still
// refuse a write (-OOM) or evict a value behind our back (a later read is then a miss).
//
// Transfers. A write SETs the 192-byte header and the payload as one value. The payload is the
// chunk itself, sent from the host memory it lies in, or its KVC1 encoding (below); either way
// its CRC32C is computed on a worker thread first. A read GETs the value: the header lands in
// the operation's own buffer, and a payload of the chunk's size straight in the transfer's host
// destination (a split bulk destination), a smaller one (an encoding) in a staging buffer that
// a worker decodes into the host destination. It completes ok only once the header names this
// chunk, model and namespace, the sizes agree, the payload matches its CRC32C and, encoded, it
// decoded (lossless: to the chunk's XXH3-128). Each transfer completes exactly once, within the
// request timeout (plus at most the one encode or decode a worker had begun by then), through
// reap():
//   ok          the bytes are in place
//   kCorrupt    the value is missing (nil: never written, evicted, FLUSHALL), of another
//               chunk, model or namespace, of the wrong length or type, fails a CRC or does
//               not decode
//   kNoSpace    Redis refused the write with -OOM (maxmemory reached under noeviction)
//   kIo         no answer in time, a connection failure, a node down, another error reply
// After a failed read the host destination holds undefined bytes; it is never written again.
//
// Probes. probe() asks, with one EXISTS per key pipelined over the pool (one round trip per
// node), which of a batch of chunks the store holds; it completes through reap() too.
//
// The event loop. The tier never blocks. Its RedisCluster keeps its sockets in an epoll set of
// its own: the owner adds poll_fd() to its loop and calls service() when it is readable or
// next_deadline() has passed. Completions are queued on the loop thread and wake_fd() (an
// eventfd) is readable while any wait, or while a worker's result waits for reap() to take it
// (a write's encoding to send, a read's verdict).
//
// Codec. With RemoteTierOptions::codec other than none, a write is encoded with KVC1 (T2's
// encoder, chunk_codec.h) on a worker, then SET. It goes raw instead when the chunk's model is
// not known yet (learn_model), when encode_queue encodes wait already, or when the encoding
// would save under 1/16 of the chunk. A reader decodes per the value's header, whatever its
// own codec: every tier reads every codec.
//
// Ownership: as Tier (tier.h): the caller keeps a transfer's host memory (and a probe's output)
// alive and the placement allocated until the completion is reaped. Destroying the tier fails
// whatever is in flight; it waits for an encode or decode running on a worker and drops the
// queued ones, so no host memory is touched after the destructor returns.
// Thread safety: every method on the event loop thread. Worker threads run encodes, decodes
// and checksums; each touches only its operation and its transfer's host memory.
#pragma once

#include "chunk_codec.h"
#include "redis_conn.h"
#include "remote_format.h"
#include "tier.h"

#include <kdn/ipc/fd.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace kdn::sidecar {

template <class Item>
class WorkerPool;

struct RemoteTierOptions {
  RedisClusterOptions redis;                               // seeds, cluster or standalone, pool, AUTH
  std::string name_space;                                  // must be a valid namespace name
  std::chrono::milliseconds timeout{500};                  // remote_timeout_ms: every request's deadline
  uint64_t capacity_bytes = 0;                             // this node's budget in the store; 0: unbounded
  uint32_t max_in_flight = 256;                            // transfers; more are refused with kBusy
  uint32_t max_probe_keys = 4096;                          // keys in one probe
  remote::RemoteCodec codec = remote::RemoteCodec::kNone;  // remote_codec: what writes are encoded with
  uint32_t workers = 2;                                    // threads for encodes, decodes and checksums
  uint32_t encode_queue = 4;                               // encodes waiting before writes go raw (docs/remote.md)
  // A write whose chunk is encoded may wait this long for a worker on top of `timeout`; its
  // SET still gets `timeout` from when it is sent. 0: the encode shares the write's deadline.
  std::chrono::milliseconds encode_wait{0};
};

struct RemoteCounters {
  uint64_t writes = 0, write_bytes = 0, reads = 0, read_bytes = 0;
  uint64_t probes = 0, probe_keys = 0, probe_hits = 0, deletes = 0;
  // The codec. write_bytes and read_bytes count chunk bytes, stored_bytes_* the payloads that
  // went over the wire: the compression ratio is write_bytes / stored_bytes_written.
  uint64_t stored_bytes_written = 0, stored_bytes_read = 0;
  uint64_t encoded_writes = 0;  // stored as KVC1
  uint64_t raw_writes = 0;      // stored raw under a codec: model unknown, encoders busy, no gain
  uint64_t decoded_reads = 0;   // KVC1 values decoded and served
  // Faults by cause (each failed transfer counts once).
  uint64_t missing = 0;        // nil: no such value
  uint64_t foreign = 0;        // a value of another chunk, model or namespace
  uint64_t bad_length = 0;     // a value whose length is not this chunk's
  uint64_t bad_header = 0;     // a header that fails its checks (CRC, magic, version, fields)
  uint64_t crc_mismatch = 0;   // a payload that fails its CRC32C
  uint64_t decode_errors = 0;  // a KVC1 payload that does not decode (or, lossless, to other bytes)
  uint64_t wrong_type = 0;     // the key holds something else (WRONGTYPE)
  uint64_t no_space = 0;       // -OOM
  uint64_t timeouts = 0;       // no answer before the deadline
  uint64_t unavailable = 0;    // connection failures, nodes down, too many redirects
  uint64_t error_replies = 0;  // any other error reply
};

class RemoteTier final : public Tier {
 public:
  // Creates the client; nothing connects before the first request.
  static Result<std::unique_ptr<RemoteTier>> create(RemoteTierOptions options) noexcept;
  ~RemoteTier() override;

  // ---- Tier
  TierId id() const noexcept override { return TierId::kRemote; }
  // Not host memory; asynchronous; copies outlive kdnd (the index does not rebuild from them:
  // a lookup finds them again with probe()).
  TierCapabilities capabilities() const noexcept override { return {false, true, true}; }
  uint64_t capacity_bytes() const noexcept override;
  uint64_t used_bytes() const noexcept override { return used_bytes_; }
  // One class (0) for every size a value can carry.
  Result<uint16_t> slot_class(uint64_t bytes) noexcept override;
  Result<Placement> allocate(uint64_t bytes) noexcept override;
  // Forgets the placement; the value stays in the store for other nodes (and the store's own
  // eviction).
  void free(const Placement& placement) noexcept override;
  // Forgets it and deletes the value (a damaged value must not be found again).
  void discard(const Placement& placement) noexcept override;
  Status submit(const Transfer& t) noexcept override;
  int wake_fd() const noexcept override { return wake_.get(); }
  size_t reap(std::span<TierCompletion> out) noexcept override;
  uint64_t in_flight() const noexcept override { return submitted_ - reaped_; }

  // ---- T3's own
  // A placement for a chunk this tier did not write (another node's, found by probe()):
  // reads GET it and expect `raw_bytes` of payload.
  Result<Placement> adopt(const ChunkIdentity& chunk, uint64_t raw_bytes) noexcept override;
  // Asks which of `chunks` the store holds. (*exists)[i] becomes 1 or 0; a key whose EXISTS
  // failed reads 0 and makes the completion's status kIo. Exactly one completion with `id`
  // follows through reap() (a non-ok return: none). The caller keeps *exists alive until then.
  Status probe(TransferId id, std::span<const ChunkIdentity> chunks, std::vector<uint8_t>* exists) noexcept override;
  // ---- the daemon's loop (tier.h's hooks; remote_tier_hooks.cc)
  // The geometry of a model's chunks, so that its writes can be encoded (reads need none).
  void learn_model(const ModelInfo& model) noexcept override { geometries_.learn(model); }
  // Replies are read (into arena slots) as they come; timers (deadlines, reconnects, slot map
  // refreshes) fire here too.
  bool advance(bool store_idle) noexcept override;
  int poll_fd() const noexcept override { return client_->fd(); }
  void on_poll_fd() noexcept override { service(); }  // replies, connects; completions follow on wake_fd
  uint64_t next_deadline_ns() const noexcept override;
  // Each fault cause is logged once, when first met: every fault is a local miss, never an error.
  void log_new_faults(std::string_view ns) noexcept override;
  void describe_stats(ipc::TierStatsRecord& r) const noexcept override;
  void describe_metrics(MetricsSink& sink) const override;

  RedisClock::time_point next_deadline() const noexcept { return client_->next_deadline(); }
  void service(RedisClock::time_point now) noexcept;
  void service() noexcept { service(RedisClock::now()); }

  const RemoteCounters& counters() const noexcept { return counters_; }
  // The Redis key of a placement ("" for an invalid one); tests and operators.
  std::string key_of(const Placement& placement) const;
  const RedisCluster& client() const noexcept { return *client_; }

  struct Op;
  struct Probe;
  using Workers = WorkerPool<Op>;

 private:
  struct Slot {
    std::string redis_key;  // names the namespace, the fingerprint and the chunk key
    ChunkIdentity chunk;
    uint64_t bytes = 0;         // allocated (the placement's size)
    uint64_t stored_bytes = 0;  // the chunk's size once a value is stored (0: nothing yet)
    uint32_t generation = 0;
    bool in_use = false;
  };

  RemoteTier(RemoteTierOptions options, std::unique_ptr<RedisCluster> client, ipc::UniqueFd wake);
  Slot* slot_of(const Placement& p) noexcept;
  const Slot* slot_of(const Placement& p) const noexcept;
  Result<Placement> new_placement(uint64_t bytes) noexcept;
  Op* new_op() noexcept;
  void release_op(Op* op) noexcept;
  Status start_write(const Transfer& t, Slot& s) noexcept;
  Status start_read(const Transfer& t, Slot& s) noexcept;
  Status post_job(Op* op, bool quick, void (*job)(Op*)) noexcept;
  void take_worker_results() noexcept;
  void send_write(Op* op) noexcept;
  void on_reply(Op* op, Status status, const resp::Reply* reply) noexcept;
  void on_write_reply(Op* op, Status status, const resp::Reply* reply) noexcept;
  void on_read_reply(Op* op, Status status, const resp::Reply* reply) noexcept;
  Status write_outcome(Status status, const resp::Reply* reply) noexcept;
  Status read_outcome(Op* op, Status status, const resp::Reply* reply) noexcept;
  void finish_read(Op* op) noexcept;
  Status failure(Status status) noexcept;
  void on_probe_reply(Op* op, Status status, const resp::Reply* reply) noexcept;
  void finish_transfer(Op* op, Status status) noexcept;
  void complete(TransferId id, Status status) noexcept;

  RemoteTierOptions options_;
  ipc::UniqueFd wake_;  // eventfd: completions wait in ready_
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::vector<std::unique_ptr<Op>> ops_;  // every operation made; idle ones in idle_ops_
  std::vector<Op*> idle_ops_;
  std::vector<std::unique_ptr<Probe>> probes_;
  std::vector<TierCompletion> ready_;
  // wake_ holds a count: one complete() wrote, or one of a worker result taken since the fd was
  // last emptied. (A result not taken yet has signalled on its own.)
  bool signalled_ = false;
  ChunkGeometries geometries_;
  std::unique_ptr<Workers> workers_;
  std::vector<Op*> worker_done_;  // results taken from the workers, being handled
  uint32_t worker_jobs_ = 0;      // posted and not taken back
  uint32_t encoding_ = 0;         // encode jobs among them
  uint64_t used_bytes_ = 0;
  uint64_t submitted_ = 0, reaped_ = 0;
  uint32_t transfers_ = 0;  // transfers in flight (not yet completed)
  RemoteCounters counters_;
  uint32_t faults_logged_ = 0;            // a bit per fault cause already logged
  std::unique_ptr<RedisCluster> client_;  // last: destroyed first, failing what is in flight
};

}  // namespace kdn::sidecar
