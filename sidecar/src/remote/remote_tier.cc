#include "remote_tier.h"

#include "worker_pool.h"

#include <kdn/common/model.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <new>

namespace kdn::sidecar {

using remote::kHeaderBytes;

namespace {

constexpr uint64_t kUnbounded = UINT64_MAX;

bool starts_with(std::string_view text, std::string_view prefix) noexcept {
  return text.substr(0, prefix.size()) == prefix;
}

uint64_t unix_ns() noexcept {
  return uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

}  // namespace

// One Redis request of the tier: a transfer's SET or GET, one key of a probe, or a DEL. Ops are
// reused; each keeps its request (whose command buffer keeps its capacity) and its header.
struct RemoteTier::Op final : resp::BulkSink {
  enum class Kind : uint8_t { kWrite, kRead, kProbe, kDelete };
  // What a worker made of a transfer.
  enum class Verdict : uint8_t { kOk, kExpired, kCrcMismatch, kDecodeError };

  // A GET's value: the header into header; a payload of the chunk's size (codec none) straight
  // into the host destination, a smaller one (a KVC1 encoding, which is always smaller) into a
  // staging buffer of its size. A value of any other length is discarded unread (and the read
  // fails): nothing larger than the chunk is ever held in memory.
  resp::BulkDestination bulk_destination(uint32_t index, uint64_t length) noexcept override {
    if (kind != Kind::kRead || index != 0 || length <= kHeaderBytes || length > kHeaderBytes + bytes)
      return {nullptr, true};
    if (length == kHeaderBytes + bytes) return {host, false, header.data(), kHeaderBytes};
    staging = AlignedBuffer(length - kHeaderBytes);
    if (staging.data() == nullptr) {
      staging_failed = true;
      return {nullptr, true};
    }
    staged = length - kHeaderBytes;
    return {staging.data(), false, header.data(), kHeaderBytes};
  }

  RemoteTier* tier = nullptr;
  Kind kind = Kind::kWrite;
  RedisRequest req;
  TransferId id = 0;
  std::byte* host = nullptr;
  uint64_t bytes = 0;  // the chunk's size
  uint32_t slot = 0, generation = 0;
  remote::ValueExpectation want;
  Probe* probe = nullptr;
  uint32_t index = 0;  // the key's place in its probe
  alignas(16) std::array<std::byte, kHeaderBytes> header{};

  // A transfer's worker job reads and writes only these (and the host bytes); the loop does not
  // touch them from posting the job until it takes the result back.
  RedisClock::time_point deadline{};  // the transfer's: a job starting later does nothing
  ChunkIdentity chunk;                // write: what is written
  kernels::ChunkGeometry geometry;    // write: the model's, when encoding
  uint8_t codec = 0;                  // write: the codec to try, then the one used; read: the value's
  bool encode_job = false;            // write: counted in encoding_
  ChunkEncoding encoding;             // write: the KVC1 blob, when it paid
  uint32_t crc = 0;                   // write: CRC32C of a raw payload; read: the header's
  kdn_key raw_hash{};                 // read: the header's
  AlignedBuffer staging;              // read: an encoded payload as it arrived
  uint64_t staged = 0;                // ... its size (0: the payload went to the host destination)
  bool staging_failed = false;        // ... no memory for it
  Verdict verdict = Verdict::kOk;
  Status status;  // kDecodeError: why
};

namespace {

using Verdict = RemoteTier::Op::Verdict;

bool expired(const RemoteTier::Op* op) noexcept { return RedisClock::now() >= op->deadline; }

// The worker half of a write: the encoding when one is asked for and pays (1/16 of the chunk at
// least: less is not worth a decode on every read), else the raw chunk's CRC32C.
void prepare_write(RemoteTier::Op* op) noexcept {
  if (expired(op)) {
    op->verdict = Verdict::kExpired;
    return;
  }
  if (op->codec != 0 &&
      encode_chunk(op->geometry, op->chunk.fingerprint, op->host, op->codec, op->bytes / 16, &op->encoding))
    return;
  op->codec = 0;
  op->crc = remote::crc32c(op->host, op->bytes);
}

// The worker half of a read: the payload's CRC32C and, for an encoding, its decode into the
// host destination.
void verify_read(RemoteTier::Op* op) noexcept {
  if (expired(op)) {
    op->verdict = Verdict::kExpired;
    return;
  }
  const std::byte* payload = op->staged != 0 ? op->staging.data() : op->host;
  const uint64_t n = op->staged != 0 ? op->staged : op->bytes;
  if (remote::crc32c(payload, n) != op->crc) {
    op->verdict = Verdict::kCrcMismatch;
    return;
  }
  if (op->staged == 0) return;
  op->status = decode_chunk(payload, n, op->codec, op->want.fingerprint, op->raw_hash, op->host, op->bytes);
  if (!op->status.ok()) op->verdict = Verdict::kDecodeError;
}

}  // namespace

struct RemoteTier::Probe {
  TransferId id = 0;
  std::vector<uint8_t>* exists = nullptr;
  size_t remaining = 0;
  Status status;
};

Result<std::unique_ptr<RemoteTier>> RemoteTier::create(RemoteTierOptions options) noexcept {
  if (!remote::valid_namespace(options.name_space))
    return Status(Code::kInvalidArgument, "remote tier: bad namespace name");
  if (uint8_t(options.codec) > remote::kMaxRemoteCodec)
    return Status(Code::kInvalidArgument, "remote tier: unknown codec");
  if (options.timeout.count() <= 0) return Status(Code::kInvalidArgument, "remote tier: the timeout must be positive");
  if (options.max_in_flight == 0)
    return Status(Code::kInvalidArgument, "remote tier: max_in_flight must be at least 1");
  // Values are up to 512 MiB: the parser must accept bulks that large.
  options.redis.conn.limits.max_bulk =
      std::max<uint64_t>(options.redis.conn.limits.max_bulk, remote::kMaxRawBytes + kHeaderBytes);
  ipc::UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return Status::from_errno("eventfd for the remote tier", errno);
  Result<std::unique_ptr<RedisCluster>> client = RedisCluster::create(options.redis);
  if (!client.ok()) return client.status();
  std::unique_ptr<RemoteTier> tier;
  try {
    tier.reset(new RemoteTier(std::move(options), std::move(client).value(), std::move(wake)));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "remote tier allocation failed");
  }
  try {
    tier->workers_ = std::make_unique<Workers>(tier->options_.workers, tier->wake_.get());
  } catch (...) {
    return Status(Code::kNoMemory, "remote tier: its worker threads could not be started");
  }
  return tier;
}

RemoteTier::RemoteTier(RemoteTierOptions options, std::unique_ptr<RedisCluster> client, ipc::UniqueFd wake)
    : options_(std::move(options)), wake_(std::move(wake)), client_(std::move(client)) {}

// The client fails every request in flight as it goes (kUnavailable): each transfer and probe
// completes into ready_, and no sink is written after this. Then the workers stop: a job that
// runs is waited for, the queued ones are dropped, and no host memory is touched after that.
RemoteTier::~RemoteTier() {
  client_.reset();
  workers_.reset();
}

uint64_t RemoteTier::capacity_bytes() const noexcept {
  return options_.capacity_bytes == 0 ? kUnbounded : options_.capacity_bytes;
}

// ---- placements ----------------------------------------------------------------------------------

Result<uint16_t> RemoteTier::slot_class(uint64_t bytes) noexcept {
  if (bytes == 0 || bytes > remote::kMaxRawBytes)
    return Status(Code::kInvalidArgument, "chunk too large for a remote value");
  return uint16_t{0};
}

Result<Placement> RemoteTier::allocate(uint64_t bytes) noexcept {
  auto cls = slot_class(bytes);
  if (!cls.ok()) return cls.status();
  if (options_.capacity_bytes != 0 && bytes > options_.capacity_bytes - std::min(used_bytes_, options_.capacity_bytes))
    return Status(Code::kNoSpace, "remote tier budget is used up");
  return new_placement(bytes);
}

// A placement's offset: the slot's generation in the high half, its index in the low half.
Result<Placement> RemoteTier::new_placement(uint64_t bytes) noexcept {
  uint32_t index = 0;
  try {
    if (free_slots_.empty()) {
      slots_.emplace_back();
      free_slots_.reserve(slots_.size());  // free() never allocates
      index = uint32_t(slots_.size() - 1);
    } else {
      index = free_slots_.back();
      free_slots_.pop_back();
    }
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "remote slot table");
  }
  Slot& s = slots_[index];
  s.in_use = true;
  s.bytes = bytes;
  s.stored_bytes = 0;
  s.chunk = ChunkIdentity{};
  s.redis_key.clear();
  used_bytes_ += bytes;
  return Placement{(uint64_t{s.generation} << 32) | index, bytes, 0};
}

RemoteTier::Slot* RemoteTier::slot_of(const Placement& p) noexcept {
  const uint64_t index = p.offset & 0xffffffffu;
  if (index >= slots_.size()) return nullptr;
  Slot& s = slots_[index];
  if (!s.in_use || s.generation != uint32_t(p.offset >> 32) || s.bytes != p.bytes) return nullptr;
  return &s;
}

const RemoteTier::Slot* RemoteTier::slot_of(const Placement& p) const noexcept {
  return const_cast<RemoteTier*>(this)->slot_of(p);
}

void RemoteTier::free(const Placement& p) noexcept {
  Slot* s = slot_of(p);
  if (s == nullptr) return;  // a stale placement: nothing of ours
  used_bytes_ -= s->bytes;
  s->in_use = false;
  ++s->generation;  // placements of the old one are refused from now on
  free_slots_.push_back(uint32_t(s - slots_.data()));
}

void RemoteTier::discard(const Placement& p) noexcept {
  Slot* s = slot_of(p);
  if (s == nullptr) return;
  if (!s->redis_key.empty()) {
    // Best effort: a DEL that fails leaves a value every reader refuses anyway.
    Op* op = new_op();
    if (op != nullptr) {
      op->kind = Op::Kind::kDelete;
      std::array<std::string_view, 2> argv = {"DEL", s->redis_key};
      try {
        resp::append_command(op->req.command, argv);
        op->req.deadline = RedisClock::now() + options_.timeout;
        ++counters_.deletes;
        client_->submit(&op->req, s->redis_key, RedisClock::now());
      } catch (const std::bad_alloc&) {
        release_op(op);
      }
    }
  }
  free(p);
}

Result<Placement> RemoteTier::adopt(const ChunkIdentity& chunk, uint64_t raw_bytes) noexcept {
  Result<Placement> p = allocate(raw_bytes);
  if (!p.ok()) return p;
  Slot& s = *slot_of(*p);
  try {
    s.redis_key = remote::value_key(options_.name_space, chunk.fingerprint, chunk.key);
  } catch (const std::bad_alloc&) {
    free(*p);
    return Status(Code::kNoMemory, "remote slot table");
  }
  s.chunk = chunk;
  s.stored_bytes = raw_bytes;  // whatever its codec: a read learns it from the value's header
  return p;
}

std::string RemoteTier::key_of(const Placement& p) const {
  const Slot* s = slot_of(p);
  return s == nullptr ? std::string() : s->redis_key;
}

// ---- operations ----------------------------------------------------------------------------------

RemoteTier::Op* RemoteTier::new_op() noexcept {
  try {
    if (idle_ops_.empty()) {
      auto op = std::make_unique<Op>();
      op->tier = this;
      Op* raw = op.get();
      op->req.done = [raw](RedisRequest&, Status status, const resp::Reply* reply) {
        raw->tier->on_reply(raw, status, reply);
      };
      ops_.push_back(std::move(op));
      idle_ops_.reserve(ops_.size());  // release_op() never allocates
      return raw;
    }
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  Op* op = idle_ops_.back();
  idle_ops_.pop_back();
  return op;
}

void RemoteTier::release_op(Op* op) noexcept {
  op->req.command.clear();
  op->req.payload_follows = false;
  op->req.payload = {};
  op->req.sink = nullptr;
  op->host = nullptr;
  op->probe = nullptr;
  op->codec = 0;
  op->encode_job = false;
  op->encoding = ChunkEncoding{};  // the blob and the staging buffer go back to the allocator
  op->staging.reset();
  op->staged = 0;
  op->staging_failed = false;
  op->verdict = Verdict::kOk;
  op->status = OkStatus();
  idle_ops_.push_back(op);
}

Status RemoteTier::submit(const Transfer& t) noexcept {
  Slot* s = slot_of(t.placement);
  if (s == nullptr) return Status(Code::kInvalidArgument, "remote transfer on a stale or unknown placement");
  if (t.host == nullptr || t.bytes == 0 || t.bytes > t.placement.bytes)
    return Status(Code::kInvalidArgument, "remote transfer outside its placement");
  if (transfers_ >= options_.max_in_flight) return Status(Code::kBusy, "remote tier: too many transfers in flight");
  try {
    ready_.reserve(in_flight() + 1);  // complete() never allocates
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "remote completion queue");
  }
  return t.direction == Transfer::Direction::kWrite ? start_write(t, *s) : start_read(t, *s);
}

// A write: the payload's CRC32C (and, with a codec, the encoding) on a worker, then send_write().
Status RemoteTier::start_write(const Transfer& t, Slot& s) noexcept {
  Op* op = new_op();
  if (op == nullptr) return Status(Code::kNoMemory, "remote operation");
  try {
    s.redis_key = remote::value_key(options_.name_space, t.chunk.fingerprint, t.chunk.key);
  } catch (const std::bad_alloc&) {
    release_op(op);
    return Status(Code::kNoMemory, "remote write command");
  }
  op->kind = Op::Kind::kWrite;
  op->id = t.id;
  op->host = t.host;
  op->bytes = t.bytes;
  op->slot = uint32_t(&s - slots_.data());
  op->generation = s.generation;
  op->chunk = t.chunk;
  const kernels::ChunkGeometry* g =
      options_.codec == remote::RemoteCodec::kNone ? nullptr : geometries_.find(t.chunk.fingerprint, t.bytes);
  // Encoders falling behind: the chunk goes raw rather than wait (a reader takes either).
  op->encode_job = g != nullptr && encoding_ < options_.encode_queue;
  op->deadline =
      RedisClock::now() + options_.timeout + (op->encode_job ? options_.encode_wait : std::chrono::milliseconds(0));
  if (op->encode_job) {
    op->codec = uint8_t(options_.codec);
    op->geometry = *g;
  }
  if (Status st = post_job(op, !op->encode_job, prepare_write); !st.ok()) {
    release_op(op);
    return st;
  }
  if (op->encode_job) ++encoding_;
  // Another chunk in this placement is readable only once the store has said OK. The same
  // chunk again stays readable meanwhile: SET is atomic, so the store holds one whole value
  // or the other, and either passes a reader's checks.
  const bool same_chunk =
      s.stored_bytes == t.bytes && s.chunk.key == t.chunk.key && s.chunk.fingerprint == t.chunk.fingerprint;
  if (!same_chunk) s.stored_bytes = 0;
  s.chunk = t.chunk;
  ++submitted_;
  ++transfers_;
  return OkStatus();
}

// SET <key> <header + payload>, once the worker is done: the header rides at the end of the
// command, after the value's "$N\r\n"; the payload follows from where it lies (the host memory,
// or the encoding).
void RemoteTier::send_write(Op* op) noexcept {
  if (op->encode_job) --encoding_;
  if (op->verdict == Verdict::kExpired)
    return finish_transfer(op, failure(Status(Code::kTimeout, "remote write: no worker was free before the deadline")));
  const Slot& s = slots_[op->slot];
  if (!s.in_use || s.generation != op->generation)
    return finish_transfer(op, Status(Code::kInvalidArgument, "remote placement freed while its write was in flight"));
  const bool encoded = op->codec != 0;
  remote::ValueHeader h;
  h.key = op->chunk.key;
  h.fingerprint = op->chunk.fingerprint;
  h.codec = remote::RemoteCodec(op->codec);
  h.raw_bytes = op->bytes;
  h.stored_bytes = encoded ? op->encoding.bytes : op->bytes;
  h.payload_crc = encoded ? op->encoding.crc : op->crc;
  h.raw_hash = op->encoding.raw_hash;
  h.name_space = options_.name_space;
  h.written_unix_ns = unix_ns();
  try {
    std::array<std::string_view, 2> argv = {"SET", s.redis_key};
    resp::append_command_head(op->req.command, argv, kHeaderBytes + h.stored_bytes);
    const size_t at = op->req.command.size();
    op->req.command.resize(at + kHeaderBytes);
    remote::encode_header(h, reinterpret_cast<std::byte*>(op->req.command.data() + at));
  } catch (const std::bad_alloc&) {
    return finish_transfer(op, Status(Code::kNoMemory, "remote write command"));
  }
  op->req.payload_follows = true;
  op->req.payload = std::span<const std::byte>(encoded ? op->encoding.blob.data() : op->host, h.stored_bytes);
  const RedisClock::time_point now = RedisClock::now();
  if (now >= op->deadline)
    return finish_transfer(op, failure(Status(Code::kTimeout, "remote write: its worker finished after the deadline")));
  op->req.deadline = std::min(op->deadline, now + options_.timeout);
  client_->submit(&op->req, s.redis_key, now);  // may complete at once (a node backing off)
}

// GET <key>: the header into the op, the payload into the host destination or, encoded, into
// staging (Op::bulk_destination); then on_read_reply().
Status RemoteTier::start_read(const Transfer& t, Slot& s) noexcept {
  if (s.stored_bytes == 0) return Status(Code::kInvalidArgument, "remote read of a placement with nothing stored");
  if (t.bytes != s.stored_bytes) return Status(Code::kInvalidArgument, "remote read of another size than stored");
  Op* op = new_op();
  if (op == nullptr) return Status(Code::kNoMemory, "remote operation");
  try {
    std::array<std::string_view, 2> argv = {"GET", s.redis_key};
    resp::append_command(op->req.command, argv);
  } catch (const std::bad_alloc&) {
    release_op(op);
    return Status(Code::kNoMemory, "remote read command");
  }
  op->kind = Op::Kind::kRead;
  op->id = t.id;
  op->host = t.host;
  op->bytes = t.bytes;
  op->slot = uint32_t(&s - slots_.data());
  op->generation = s.generation;
  op->want = remote::ValueExpectation{options_.name_space, s.chunk.key, s.chunk.fingerprint};
  op->req.sink = op;
  const RedisClock::time_point now = RedisClock::now();
  op->req.deadline = op->deadline = now + options_.timeout;
  ++submitted_;
  ++transfers_;
  client_->submit(&op->req, s.redis_key, now);
  return OkStatus();
}

Status RemoteTier::probe(TransferId id, std::span<const ChunkIdentity> chunks, std::vector<uint8_t>* exists) noexcept {
  if (exists == nullptr || chunks.size() > options_.max_probe_keys)
    return Status(Code::kInvalidArgument, "remote probe: too many keys");
  std::vector<Op*> ops;
  std::vector<std::string> keys;
  Probe* p = nullptr;
  try {
    ready_.reserve(in_flight() + 1);
    exists->assign(chunks.size(), 0);
    ops.reserve(chunks.size());
    keys.reserve(chunks.size());
    probes_.push_back(std::make_unique<Probe>());
    p = probes_.back().get();
    for (const ChunkIdentity& c : chunks) keys.push_back(remote::value_key(options_.name_space, c.fingerprint, c.key));
    for (size_t i = 0; i < chunks.size(); ++i) {
      Op* op = new_op();
      if (op == nullptr) throw std::bad_alloc();
      ops.push_back(op);
      std::array<std::string_view, 2> argv = {"EXISTS", keys[i]};
      resp::append_command(op->req.command, argv);
    }
  } catch (const std::bad_alloc&) {
    for (Op* op : ops) release_op(op);
    if (p != nullptr) probes_.pop_back();
    return Status(Code::kNoMemory, "remote probe");
  }
  p->id = id;
  p->exists = exists;
  p->remaining = chunks.size();
  ++submitted_;
  ++counters_.probes;
  counters_.probe_keys += chunks.size();
  if (chunks.empty()) {
    probes_.pop_back();
    complete(id, OkStatus());
    return OkStatus();
  }
  const RedisClock::time_point now = RedisClock::now();
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i]->kind = Op::Kind::kProbe;
    ops[i]->probe = p;
    ops[i]->index = uint32_t(i);
    ops[i]->req.deadline = now + options_.timeout;
  }
  // Submitted together, the EXISTS go out pipelined: one round trip per node.
  for (size_t i = 0; i < ops.size(); ++i) client_->submit(&ops[i]->req, keys[i], now);
  return OkStatus();
}

// ---- completions ---------------------------------------------------------------------------------

void RemoteTier::service(RedisClock::time_point now) noexcept { client_->poll(now); }

// Quick jobs (checksums, decodes a read waits for) run ahead of queued encodes.
Status RemoteTier::post_job(Op* op, bool quick, void (*job)(Op*)) noexcept {
  try {
    // The pool, not workers_: the destructor's reset() empties workers_ before the pool waits
    // for the jobs that run.
    workers_->post(
        [pool = workers_.get(), op, job] {
          job(op);
          pool->done(op);
        },
        quick ? Workers::Lane::kQuick : Workers::Lane::kBulk);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "remote tier worker queue");
  }
  ++worker_jobs_;
  return OkStatus();
}

void RemoteTier::take_worker_results() noexcept {
  if (worker_jobs_ == 0) return;
  workers_->take_done(worker_done_);
  if (worker_done_.empty()) return;
  signalled_ = true;  // each result signalled wake_ before it could be taken
  worker_jobs_ -= uint32_t(worker_done_.size());
  for (Op* op : worker_done_) {
    if (op->kind == Op::Kind::kWrite) {
      send_write(op);
    } else {
      finish_read(op);
    }
  }
  worker_done_.clear();
}

void RemoteTier::on_reply(Op* op, Status status, const resp::Reply* reply) noexcept {
  switch (op->kind) {
    case Op::Kind::kWrite:
      return on_write_reply(op, status, reply);
    case Op::Kind::kRead:
      return on_read_reply(op, status, reply);
    case Op::Kind::kProbe:
      return on_probe_reply(op, status, reply);
    case Op::Kind::kDelete:
      return release_op(op);
  }
}

void RemoteTier::on_write_reply(Op* op, Status status, const resp::Reply* reply) noexcept {
  Status st = write_outcome(status, reply);
  if (st.ok()) {
    Slot& s = slots_[op->slot];
    if (s.in_use && s.generation == op->generation) s.stored_bytes = op->bytes;
    ++counters_.writes;
    counters_.write_bytes += op->bytes;
    counters_.stored_bytes_written += op->req.payload.size();
    if (op->codec != 0) {
      ++counters_.encoded_writes;
    } else if (options_.codec != remote::RemoteCodec::kNone) {
      ++counters_.raw_writes;
    }
  }
  finish_transfer(op, st);
}

// The header checked, the payload goes to a worker (its CRC32C, and an encoding's decode).
void RemoteTier::on_read_reply(Op* op, Status status, const resp::Reply* reply) noexcept {
  Status st = read_outcome(op, status, reply);
  if (!st.ok()) return finish_transfer(op, st);
  if (post_job(op, true, verify_read).ok()) return;
  verify_read(op);  // no room in the worker queue: check here, late rather than never
  finish_read(op);
}

void RemoteTier::finish_read(Op* op) noexcept {
  Status st;
  switch (op->verdict) {
    case Verdict::kOk:
      ++counters_.reads;
      counters_.read_bytes += op->bytes;
      counters_.stored_bytes_read += op->staged != 0 ? op->staged : op->bytes;
      if (op->staged != 0) ++counters_.decoded_reads;
      break;
    case Verdict::kExpired:
      st = failure(Status(Code::kTimeout, "remote read: no worker was free to check it before the deadline"));
      break;
    case Verdict::kCrcMismatch:
      ++counters_.crc_mismatch;
      st = Status(Code::kCorrupt, "remote value: payload CRC mismatch");
      break;
    case Verdict::kDecodeError:
      ++counters_.decode_errors;
      st = op->status;
      break;
  }
  finish_transfer(op, st);
}

void RemoteTier::finish_transfer(Op* op, Status status) noexcept {
  --transfers_;
  const TransferId id = op->id;
  release_op(op);
  complete(id, status);
}

// A request that got no reply: the node is down, unreachable or too slow. kIo, keeping the
// client's reason.
Status RemoteTier::failure(Status status) noexcept {
  if (status.code() == Code::kTimeout) {
    ++counters_.timeouts;
  } else {
    ++counters_.unavailable;
  }
  return Status(Code::kIo, status.what());
}

Status RemoteTier::write_outcome(Status status, const resp::Reply* reply) noexcept {
  if (!status.ok()) return failure(status);
  if (reply->is_error()) {
    if (starts_with(reply->status_text(), "OOM")) {
      ++counters_.no_space;
      return Status(Code::kNoSpace, "remote store is out of memory (-OOM)");
    }
    ++counters_.error_replies;
    return Status(Code::kIo, "remote store refused the write");
  }
  if (reply->root().type != resp::Type::kSimple || reply->status_text() != "OK") {
    ++counters_.error_replies;
    return Status(Code::kIo, "remote store answered SET unexpectedly");
  }
  return OkStatus();
}

Status RemoteTier::read_outcome(Op* op, Status status, const resp::Reply* reply) noexcept {
  if (!status.ok()) return failure(status);
  const resp::Node& root = reply->root();
  if (reply->is_error()) {
    if (starts_with(reply->status_text(), "WRONGTYPE")) {
      ++counters_.wrong_type;
      return Status(Code::kCorrupt, "remote key holds another type");
    }
    ++counters_.error_replies;
    return Status(Code::kIo, "remote store refused the read");
  }
  if (root.type == resp::Type::kNil) {
    ++counters_.missing;
    return Status(Code::kCorrupt, "remote value missing");
  }
  if (root.type != resp::Type::kBulk || root.bulk != resp::Node::Bulk::kSunk) {
    if (op->staging_failed) return Status(Code::kNoMemory, "no memory to stage a compressed remote value");
    ++counters_.bad_length;  // the sink discarded it: not a length this chunk's value can have
    return Status(Code::kCorrupt, "remote value has another length than the chunk");
  }
  remote::ValueHeader h;
  if (Status st = remote::decode_header(op->header, &h); !st.ok()) {
    ++counters_.bad_header;
    return Status(Code::kCorrupt, st.what());
  }
  if (h.raw_bytes != op->bytes) {
    ++counters_.bad_length;
    return Status(Code::kCorrupt, "remote value header disagrees with the chunk's size");
  }
  if (Status st = remote::check_header(h, op->want, uint64_t(root.value)); !st.ok()) {
    ++counters_.foreign;
    return st;
  }
  // The length the header vouches for put the payload where its codec needs it: the chunk's
  // size (codec none) in the host destination, a smaller encoding in staging.
  if ((h.codec == remote::RemoteCodec::kNone) != (op->staged == 0)) {
    ++counters_.bad_header;
    return Status(Code::kCorrupt, "remote value: its codec disagrees with its size");
  }
  op->codec = uint8_t(h.codec);
  op->crc = h.payload_crc;
  op->raw_hash = h.raw_hash;
  return OkStatus();
}

void RemoteTier::on_probe_reply(Op* op, Status status, const resp::Reply* reply) noexcept {
  Probe* p = op->probe;
  const uint32_t index = op->index;
  release_op(op);
  if (!status.ok()) {
    Status st = failure(status);
    if (p->status.ok()) p->status = st;
  } else if (reply->is_error() || reply->root().type != resp::Type::kInteger) {
    ++counters_.error_replies;
    if (p->status.ok()) p->status = Status(Code::kIo, "remote store refused EXISTS");
  } else if (reply->root().value > 0) {
    (*p->exists)[index] = 1;
    ++counters_.probe_hits;
  }
  if (--p->remaining > 0) return;
  const TransferId id = p->id;
  const Status st = p->status;
  auto it = std::find_if(probes_.begin(), probes_.end(), [p](const auto& q) { return q.get() == p; });
  if (it != probes_.end()) {
    std::swap(*it, probes_.back());
    probes_.pop_back();
  }
  complete(id, st);
}

// Queues a completion (room was reserved at submission) and makes wake_fd readable.
void RemoteTier::complete(TransferId id, Status status) noexcept {
  ready_.push_back(TierCompletion{id, status});
  if (!signalled_) {
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
    signalled_ = true;
  }
}

// Workers' results first (a write's encoding goes out; a read's verdict completes it), then the
// completions. The fd is emptied only when none waits, and results are taken again after that:
// a worker that signalled before the read has its result taken now, one after it signals anew.
size_t RemoteTier::reap(std::span<TierCompletion> out) noexcept {
  size_t n = 0;
  for (;;) {
    take_worker_results();
    const size_t k = std::min(out.size() - n, ready_.size());
    std::copy_n(ready_.begin(), k, out.begin() + static_cast<ptrdiff_t>(n));
    ready_.erase(ready_.begin(), ready_.begin() + static_cast<ptrdiff_t>(k));
    reaped_ += k;
    n += k;
    if (!ready_.empty() || !signalled_) return n;
    uint64_t count;
    (void)!::read(wake_.get(), &count, sizeof count);  // empty: the fd stops being readable
    signalled_ = false;
    if (worker_jobs_ == 0) return n;
  }
}

}  // namespace kdn::sidecar
