#include "remote_tier.h"

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
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
}

}  // namespace

// One Redis request of the tier: a transfer's SET or GET, one key of a probe, or a DEL. Ops are
// reused; each keeps its request (whose command buffer keeps its capacity) and its header.
struct RemoteTier::Op final : resp::BulkSink {
  enum class Kind : uint8_t { kWrite, kRead, kProbe, kDelete };

  // A GET's value: the header into header, the payload into the host destination. A value of
  // any other length is discarded unread (and the read fails).
  resp::BulkDestination bulk_destination(uint32_t index, uint64_t length) noexcept override {
    if (kind != Kind::kRead || index != 0 || length != kHeaderBytes + bytes) return {nullptr, true};
    return {host, false, header.data(), kHeaderBytes};
  }

  RemoteTier* tier = nullptr;
  Kind kind = Kind::kWrite;
  RedisRequest req;
  TransferId id = 0;
  std::byte* host = nullptr;
  uint64_t bytes = 0;        // the payload's size
  uint32_t slot = 0, generation = 0;
  remote::ValueExpectation want;
  Probe* probe = nullptr;
  uint32_t index = 0;        // the key's place in its probe
  alignas(16) std::array<std::byte, kHeaderBytes> header{};
};

struct RemoteTier::Probe {
  TransferId id = 0;
  std::vector<uint8_t>* exists = nullptr;
  size_t remaining = 0;
  Status status;
};

Result<std::unique_ptr<RemoteTier>> RemoteTier::create(RemoteTierOptions options) noexcept {
  if (!remote::valid_namespace(options.name_space)) return Status(Code::kInvalidArgument, "remote tier: bad namespace name");
  if (options.codec != remote::RemoteCodec::kNone)
    return Status(Code::kUnsupported, "remote tier: only remote_codec = none is built");
  if (options.timeout.count() <= 0) return Status(Code::kInvalidArgument, "remote tier: the timeout must be positive");
  if (options.max_in_flight == 0) return Status(Code::kInvalidArgument, "remote tier: max_in_flight must be at least 1");
  // Values are up to 512 MiB: the parser must accept bulks that large.
  options.redis.conn.limits.max_bulk = std::max<uint64_t>(options.redis.conn.limits.max_bulk, remote::kMaxRawBytes + kHeaderBytes);
  ipc::UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return Status::from_errno("eventfd for the remote tier", errno);
  Result<std::unique_ptr<RedisCluster>> client = RedisCluster::create(options.redis);
  if (!client.ok()) return client.status();
  try {
    return std::unique_ptr<RemoteTier>(new RemoteTier(std::move(options), std::move(client).value(), std::move(wake)));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "remote tier allocation failed");
  }
}

RemoteTier::RemoteTier(RemoteTierOptions options, std::unique_ptr<RedisCluster> client, ipc::UniqueFd wake)
    : options_(std::move(options)), wake_(std::move(wake)), client_(std::move(client)) {}

// The client fails every request in flight as it goes (kUnavailable): each transfer and probe
// completes into ready_, and no sink is written after this.
RemoteTier::~RemoteTier() { client_.reset(); }

uint64_t RemoteTier::capacity_bytes() const noexcept {
  return options_.capacity_bytes == 0 ? kUnbounded : options_.capacity_bytes;
}

// ---- placements ----------------------------------------------------------------------------------

Result<uint16_t> RemoteTier::slot_class(uint64_t bytes) noexcept {
  if (bytes == 0 || bytes > remote::kMaxRawBytes) return Status(Code::kInvalidArgument, "chunk too large for a remote value");
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
  s.stored_bytes = raw_bytes;  // codec none: the payload is the chunk
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

// SET <key> <header + payload>: the header rides at the end of the command, after the value's
// "$N\r\n"; the payload follows from the host memory it lies in.
Status RemoteTier::start_write(const Transfer& t, Slot& s) noexcept {
  Op* op = new_op();
  if (op == nullptr) return Status(Code::kNoMemory, "remote operation");
  remote::ValueHeader h;
  h.key = t.chunk.key;
  h.fingerprint = t.chunk.fingerprint;
  h.codec = remote::RemoteCodec::kNone;  // the remote_codec seam: encode here, on a worker
  h.raw_bytes = h.stored_bytes = t.bytes;
  h.payload_crc = remote::crc32c(t.host, t.bytes);
  h.name_space = options_.name_space;
  h.written_unix_ns = unix_ns();
  try {
    s.redis_key = remote::value_key(options_.name_space, t.chunk.fingerprint, t.chunk.key);
    std::array<std::string_view, 2> argv = {"SET", s.redis_key};
    resp::append_command_head(op->req.command, argv, kHeaderBytes + t.bytes);
    const size_t at = op->req.command.size();
    op->req.command.resize(at + kHeaderBytes);
    remote::encode_header(h, reinterpret_cast<std::byte*>(op->req.command.data() + at));
  } catch (const std::bad_alloc&) {
    release_op(op);
    return Status(Code::kNoMemory, "remote write command");
  }
  // Another chunk in this placement is readable only once the store has said OK. The same
  // chunk again stays readable meanwhile: SET is atomic, so the store holds one whole value
  // or the other, and either passes a reader's checks.
  const bool same_chunk = s.stored_bytes == t.bytes && s.chunk.key == t.chunk.key &&
                          s.chunk.fingerprint == t.chunk.fingerprint;
  if (!same_chunk) s.stored_bytes = 0;
  s.chunk = t.chunk;
  op->kind = Op::Kind::kWrite;
  op->id = t.id;
  op->bytes = t.bytes;
  op->slot = uint32_t(&s - slots_.data());
  op->generation = s.generation;
  op->req.payload_follows = true;
  op->req.payload = std::span<const std::byte>(t.host, t.bytes);
  const RedisClock::time_point now = RedisClock::now();
  op->req.deadline = now + options_.timeout;
  ++submitted_;
  ++transfers_;
  client_->submit(&op->req, s.redis_key, now);  // may complete at once (a node backing off)
  return OkStatus();
}

// GET <key>, the header into the op and the payload straight into the host destination.
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
  op->req.deadline = now + options_.timeout;
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

void RemoteTier::on_reply(Op* op, Status status, const resp::Reply* reply) noexcept {
  switch (op->kind) {
    case Op::Kind::kWrite: {
      Status st = write_outcome(status, reply);
      Slot& s = slots_[op->slot];
      if (st.ok()) {
        if (s.in_use && s.generation == op->generation) s.stored_bytes = op->bytes;
        ++counters_.writes;
        counters_.write_bytes += op->bytes;
      }
      --transfers_;
      const TransferId id = op->id;
      release_op(op);
      return complete(id, st);
    }
    case Op::Kind::kRead: {
      Status st = read_outcome(op, status, reply);
      if (st.ok()) {
        ++counters_.reads;
        counters_.read_bytes += op->bytes;
      }
      --transfers_;
      const TransferId id = op->id;
      release_op(op);
      return complete(id, st);
    }
    case Op::Kind::kProbe: return on_probe_reply(op, status, reply);
    case Op::Kind::kDelete: return release_op(op);
  }
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
    ++counters_.bad_length;  // the sink discarded it: not this chunk's length
    return Status(Code::kCorrupt, "remote value has another length than the chunk");
  }
  remote::ValueHeader h;
  if (Status st = remote::decode_header(op->header, &h); !st.ok()) {
    ++counters_.bad_header;
    return Status(Code::kCorrupt, st.what());
  }
  if (h.stored_bytes != op->bytes) {
    ++counters_.bad_length;
    return Status(Code::kCorrupt, "remote value header disagrees with the chunk's size");
  }
  if (Status st = remote::check_header(h, op->want, uint64_t(root.value)); !st.ok()) {
    ++counters_.foreign;
    return st;
  }
  if (h.codec != remote::RemoteCodec::kNone) {  // the remote_codec seam: decode here, on a worker
    ++counters_.bad_header;
    return Status(Code::kCorrupt, "remote value is compressed; this build decodes codec none only");
  }
  if (remote::crc32c(op->host, op->bytes) != h.payload_crc) {
    ++counters_.crc_mismatch;
    return Status(Code::kCorrupt, "remote value: payload CRC mismatch");
  }
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

size_t RemoteTier::reap(std::span<TierCompletion> out) noexcept {
  const size_t n = std::min(out.size(), ready_.size());
  std::copy_n(ready_.begin(), n, out.begin());
  ready_.erase(ready_.begin(), ready_.begin() + static_cast<ptrdiff_t>(n));
  reaped_ += n;
  if (ready_.empty() && signalled_) {
    uint64_t count;
    (void)!::read(wake_.get(), &count, sizeof count);  // empty: the fd stops being readable
    signalled_ = false;
  }
  return n;
}

}  // namespace kdn::sidecar
