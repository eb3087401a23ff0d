#include "hiredis_cluster.h"

#if KDN_BENCH_HAVE_HIREDIS
#include "redis_cluster.h"  // kdn's key_slot(): the same routing as RemoteTier's

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <utility>
#endif

namespace kdn::bench {

#if !KDN_BENCH_HAVE_HIREDIS

struct HiredisCluster::State {};

Result<std::unique_ptr<HiredisCluster>> HiredisCluster::connect(const std::string&, int, uint32_t,
                                                                std::chrono::milliseconds, std::string* why) noexcept {
  *why = "kdn-bench was built without hiredis";
  return Status(Code::kUnavailable, "kdn-bench was built without hiredis");
}
HiredisCluster::HiredisCluster(std::unique_ptr<State> state) noexcept : state_(std::move(state)) {}
HiredisCluster::~HiredisCluster() = default;
Status HiredisCluster::get_all(std::span<const std::string>, std::span<const GetTarget>, uint32_t) noexcept {
  return Status(Code::kUnavailable, "no hiredis");
}
Result<uint64_t> HiredisCluster::exists_all(std::span<const std::string>) noexcept {
  return Status(Code::kUnavailable, "no hiredis");
}
Result<std::string> HiredisCluster::get_value(const std::string&) noexcept {
  return Status(Code::kUnavailable, "no hiredis");
}
Result<uint64_t> HiredisCluster::value_length(const std::string&) noexcept {
  return Status(Code::kUnavailable, "no hiredis");
}
size_t HiredisCluster::connections() const noexcept { return 0; }
size_t HiredisCluster::masters() const noexcept { return 0; }
const std::string& HiredisCluster::last_error() const noexcept {
  static const std::string none;
  return none;
}

#else

namespace {

constexpr size_t kReadBytes = 1 << 20;

struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

struct ContextFree {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextFree>;

Result<Context> open_context(const std::string& host, int port, std::chrono::milliseconds timeout, std::string* why) {
  const timeval tv{timeout.count() / 1000, (timeout.count() % 1000) * 1000};
  Context c(redisConnectWithTimeout(host.c_str(), port, tv));
  if (!c || c->err != 0) {
    *why = "hiredis: cannot connect to " + host + ":" + std::to_string(port) +
           (c ? std::string(": ") + c->errstr : std::string());
    return Status(Code::kUnavailable, "hiredis: cannot connect");
  }
  // Parsed replies are discarded as they are consumed; keep the reader's buffer between
  // multi-MiB values instead of freeing it after each (hiredis frees buffers over 16 KiB).
  c->reader->maxbuf = 0;
  return c;
}

}  // namespace

struct HiredisCluster::State {
  struct Conn {
    Context ctx;
    std::deque<size_t> waiting;  // requests sent or queued, in order
  };
  std::vector<Conn> conns;      // pool_size per master, master by master
  std::vector<uint16_t> owner;  // slot -> master index
  size_t masters = 0;
  uint32_t pool = 1;
  std::chrono::milliseconds timeout{};
  std::vector<char> buffer = std::vector<char>(kReadBytes);
  Status broken;       // after a failure the connections' state is unknown
  std::string detail;  // what the last failure was about

  Status fail(Code code, const char* what, std::string more) {
    detail = std::string(what) + (more.empty() ? "" : ": " + more);
    return Status(code, what);
  }

  Conn& connection_for(std::string_view key) {
    const size_t first = size_t(owner[sidecar::key_slot(key)]) * pool;
    size_t best = first;
    for (size_t i = first + 1; i < first + pool; ++i) {
      if (conns[i].waiting.size() < conns[best].waiting.size()) best = i;
    }
    return conns[best];
  }

  Status flush() {
    for (Conn& c : conns) {
      int done = 0;
      if (sdslen(c.ctx->obuf) > 0 && redisBufferWrite(c.ctx.get(), &done) != REDIS_OK) {
        return fail(Code::kIo, "hiredis write failed", c.ctx->errstr);
      }
    }
    return OkStatus();
  }

  // Reads what `c` has and hands every whole reply to on_reply; returns how many completed.
  Result<size_t> drain(Conn& c, const std::function<Status(size_t, redisReply*)>& on_reply) {
    const ssize_t n = ::read(c.ctx->fd, buffer.data(), buffer.size());
    if (n == 0) return Status(Code::kIo, "hiredis: the server closed the connection");
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return size_t{0};
      return Status::from_errno("hiredis read", errno);
    }
    if (redisReaderFeed(c.ctx->reader, buffer.data(), size_t(n)) != REDIS_OK) {
      return Status(Code::kProtocol, "hiredis reader");
    }
    size_t completed = 0;
    for (;;) {
      void* raw = nullptr;
      if (redisReaderGetReply(c.ctx->reader, &raw) != REDIS_OK) return Status(Code::kProtocol, "hiredis reader");
      if (raw == nullptr) return completed;
      Reply reply(static_cast<redisReply*>(raw));
      if (c.waiting.empty()) return Status(Code::kProtocol, "a reply nobody asked for");
      const size_t index = c.waiting.front();
      c.waiting.pop_front();
      if (Status st = on_reply(index, reply.get()); !st.ok()) return st;
      ++completed;
    }
  }

  // Sends requests 0..count-1 (`append` formats request i on a connection, routed by key(i)),
  // at most `depth` in flight, and hands each reply to on_reply.
  Status run(size_t count, uint32_t depth, const std::function<std::string_view(size_t)>& key,
             const std::function<void(redisContext*, size_t)>& append,
             const std::function<Status(size_t, redisReply*)>& on_reply) {
    if (!broken.ok()) return broken;
    Status st = pipeline(count, depth, key, append, on_reply);
    if (!st.ok()) {
      broken = st;
      if (detail.empty()) detail = st.what();
    }
    return st;
  }

  Status pipeline(size_t count, uint32_t depth, const std::function<std::string_view(size_t)>& key,
                  const std::function<void(redisContext*, size_t)>& append,
                  const std::function<Status(size_t, redisReply*)>& on_reply) {
    size_t next = 0, done = 0;
    std::vector<pollfd> fds(conns.size());
    while (done < count) {
      for (; next < count && next - done < depth; ++next) {
        Conn& c = connection_for(key(next));
        append(c.ctx.get(), next);
        c.waiting.push_back(next);
      }
      if (Status st = flush(); !st.ok()) return st;
      for (size_t i = 0; i < conns.size(); ++i) {
        fds[i] = pollfd{conns[i].ctx->fd, short(POLLIN | (sdslen(conns[i].ctx->obuf) > 0 ? POLLOUT : 0)), 0};
      }
      const int n = ::poll(fds.data(), fds.size(), int(timeout.count()));
      if (n == 0) return Status(Code::kTimeout, "hiredis: no reply in time");
      if (n < 0 && errno != EINTR) return Status::from_errno("poll", errno);
      for (size_t i = 0; n > 0 && i < conns.size(); ++i) {
        if ((fds[i].revents & (POLLIN | POLLERR | POLLHUP)) == 0) continue;
        Result<size_t> completed = drain(conns[i], on_reply);
        if (!completed.ok()) return completed.status();
        done += *completed;
      }
    }
    return OkStatus();
  }
};

Result<std::unique_ptr<HiredisCluster>> HiredisCluster::connect(const std::string& host, int seed_port,
                                                                uint32_t pool_size, std::chrono::milliseconds timeout,
                                                                std::string* why) noexcept {
  auto state = std::make_unique<State>();
  state->pool = std::max<uint32_t>(1, pool_size);
  state->timeout = timeout;
  state->owner.assign(sidecar::kClusterSlots, UINT16_MAX);
  std::vector<std::pair<std::string, int>> masters;
  {
    Result<Context> seed = open_context(host, seed_port, timeout, why);
    if (!seed.ok()) return seed.status();
    Reply slots(static_cast<redisReply*>(redisCommand(seed->get(), "CLUSTER SLOTS")));
    if (!slots || slots->type != REDIS_REPLY_ARRAY) {
      *why = "hiredis: CLUSTER SLOTS failed";
      return Status(Code::kUnavailable, "hiredis: CLUSTER SLOTS failed");
    }
    for (size_t i = 0; i < slots->elements; ++i) {
      const redisReply* range = slots->element[i];
      if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 || range->element[2]->type != REDIS_REPLY_ARRAY ||
          range->element[2]->elements < 2) {
        *why = "hiredis: a CLUSTER SLOTS entry of another shape";
        return Status(Code::kProtocol, "hiredis: a CLUSTER SLOTS entry of another shape");
      }
      const redisReply* node = range->element[2];
      std::string node_host(node->element[0]->str, node->element[0]->len);
      if (node_host.empty() || node_host == "?") node_host = host;
      const std::pair<std::string, int> address{node_host, int(node->element[1]->integer)};
      size_t m = 0;
      while (m < masters.size() && masters[m] != address) ++m;
      if (m == masters.size()) masters.push_back(address);
      for (long long s = range->element[0]->integer; s <= range->element[1]->integer && s < sidecar::kClusterSlots;
           ++s) {
        state->owner[size_t(s)] = uint16_t(m);
      }
    }
  }
  for (uint16_t o : state->owner) {
    if (o == UINT16_MAX) {
      *why = "hiredis: the cluster does not cover every slot";
      return Status(Code::kUnavailable, "hiredis: the cluster does not cover every slot");
    }
  }
  state->masters = masters.size();
  for (const auto& [node_host, port] : masters) {
    for (uint32_t j = 0; j < state->pool; ++j) {
      Result<Context> c = open_context(node_host, port, timeout, why);
      if (!c.ok()) return c.status();
      const int flags = ::fcntl(c.value()->fd, F_GETFL);
      if (flags < 0 || ::fcntl(c.value()->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
        *why = std::string("fcntl O_NONBLOCK: ") + std::strerror(errno);
        return Status::from_errno("fcntl O_NONBLOCK", errno);
      }
      c.value()->flags &= ~REDIS_BLOCK;  // redisBufferWrite then takes EAGAIN as "later"
      state->conns.push_back(State::Conn{std::move(c).value(), {}});
    }
  }
  return std::unique_ptr<HiredisCluster>(new HiredisCluster(std::move(state)));
}

HiredisCluster::HiredisCluster(std::unique_ptr<State> state) noexcept : state_(std::move(state)) {}
HiredisCluster::~HiredisCluster() = default;

size_t HiredisCluster::connections() const noexcept { return state_->conns.size(); }
size_t HiredisCluster::masters() const noexcept { return state_->masters; }
const std::string& HiredisCluster::last_error() const noexcept { return state_->detail; }

Status HiredisCluster::get_all(std::span<const std::string> keys, std::span<const GetTarget> targets,
                               uint32_t depth) noexcept {
  if (keys.size() != targets.size() || depth == 0) return Status(Code::kInvalidArgument, "get_all");
  return state_->run(
      keys.size(), depth, [&](size_t i) { return std::string_view(keys[i]); },
      [&](redisContext* c, size_t i) { redisAppendCommand(c, "GET %b", keys[i].data(), keys[i].size()); },
      [&](size_t i, redisReply* r) {
        const GetTarget& t = targets[i];
        if (r->type == REDIS_REPLY_NIL) return state_->fail(Code::kCorrupt, "GET: no such key", keys[i]);
        if (r->type != REDIS_REPLY_STRING) {
          return state_->fail(Code::kIo, "GET: not a value",
                              keys[i] + ": " + std::string(r->str ? r->str : "", r->len));
        }
        if (uint64_t(r->len) != t.value_bytes || t.skip + t.bytes > t.value_bytes) {
          return state_->fail(Code::kCorrupt, "GET: a value of another length",
                              keys[i] + ": " + std::to_string(r->len));
        }
        std::memcpy(t.dest, r->str + t.skip, t.bytes);
        return OkStatus();
      });
}

Result<uint64_t> HiredisCluster::exists_all(std::span<const std::string> keys) noexcept {
  uint64_t found = 0;
  Status st = state_->run(
      keys.size(), uint32_t(keys.size()), [&](size_t i) { return std::string_view(keys[i]); },
      [&](redisContext* c, size_t i) { redisAppendCommand(c, "EXISTS %b", keys[i].data(), keys[i].size()); },
      [&](size_t, redisReply* r) {
        if (r->type != REDIS_REPLY_INTEGER) return state_->fail(Code::kIo, "EXISTS: not an integer", "");
        found += uint64_t(r->integer);
        return OkStatus();
      });
  if (!st.ok()) return st;
  return found;
}

Result<std::string> HiredisCluster::get_value(const std::string& key) noexcept {
  std::string value;
  Status st = state_->run(
      1, 1, [&](size_t) { return std::string_view(key); },
      [&](redisContext* c, size_t) { redisAppendCommand(c, "GET %b", key.data(), key.size()); },
      [&](size_t, redisReply* r) {
        if (r->type == REDIS_REPLY_NIL) return state_->fail(Code::kCorrupt, "GET: no such key", key);
        if (r->type != REDIS_REPLY_STRING) return state_->fail(Code::kIo, "GET: not a value", key);
        value.assign(r->str, r->len);
        return OkStatus();
      });
  if (!st.ok()) return st;
  return value;
}

Result<uint64_t> HiredisCluster::value_length(const std::string& key) noexcept {
  uint64_t length = 0;
  Status st = state_->run(
      1, 1, [&](size_t) { return std::string_view(key); },
      [&](redisContext* c, size_t) { redisAppendCommand(c, "STRLEN %b", key.data(), key.size()); },
      [&](size_t, redisReply* r) {
        if (r->type != REDIS_REPLY_INTEGER) return state_->fail(Code::kIo, "STRLEN: not an integer", key);
        length = uint64_t(r->integer);
        return OkStatus();
      });
  if (!st.ok()) return st;
  return length;
}

#endif  // KDN_BENCH_HAVE_HIREDIS

}  // namespace kdn::bench
