#include "redis_conn.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kdn::sidecar {
namespace {

constexpr size_t kReadChunk = 256 << 10;
constexpr size_t kReadBudget = 16 << 20;  // per on_readable(), so one big reply cannot starve the loop
constexpr size_t kMaxIov = 64;
constexpr std::string_view kAsking = "*1\r\n$6\r\nASKING\r\n";

// Bulks of a request that gave up are read and thrown away.
class DiscardSink final : public resp::BulkSink {
 public:
  resp::BulkDestination bulk_destination(uint32_t, uint64_t) noexcept override { return {nullptr, true}; }
};
DiscardSink g_discard;

// A socket address for `e`; false if the host is not a numeric address.
bool socket_address(const RedisEndpoint& e, sockaddr_storage* out, socklen_t* len) {
  std::memset(out, 0, sizeof *out);
  if (!e.unix_path.empty()) {
    auto* un = reinterpret_cast<sockaddr_un*>(out);
    if (e.unix_path.size() >= sizeof un->sun_path) return false;
    un->sun_family = AF_UNIX;
    std::memcpy(un->sun_path, e.unix_path.data(), e.unix_path.size());
    *len = sizeof *un;
    return true;
  }
  const std::string& host = e.tcp.host == "localhost" ? std::string("127.0.0.1") : e.tcp.host;
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(e.tcp.port);
    *len = sizeof *v4;
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(e.tcp.port);
    *len = sizeof *v6;
    return true;
  }
  return false;
}

}  // namespace

RedisConn::RedisConn(RedisEndpoint endpoint, const RedisConnOptions& options, ReplyHandler* handler)
    : endpoint_(std::move(endpoint)), options_(options), handler_(handler), parser_(options.limits) {
  if (!options_.password.empty()) {
    std::vector<std::string_view> argv = {"AUTH"};
    if (!options_.username.empty()) argv.push_back(options_.username);
    argv.push_back(options_.password);
    resp::append_command(auth_command_, argv);
  }
}

RedisConn::~RedisConn() { fail_connection(Status(Code::kUnavailable, "redis connection closed")); }

void RedisConn::submit(RedisRequest* r, RedisClock::time_point now) noexcept {
  now_ = now;
  ++counters_.submitted;
  if (state_ == State::kBackoff && now >= backoff_until_) state_ = State::kIdle;
  if (state_ == State::kBackoff)
    return complete(r, Status(Code::kUnavailable, "redis server unreachable (backing off)"), nullptr);
  if (state_ == State::kIdle) {
    Status st = start_connect(now);
    if (!st.ok()) return complete(r, st, nullptr);
  }
  queue_.push_back(Entry{r, Kind::kRequest, r->asking, false, {}});
}

uint32_t RedisConn::events() const noexcept {
  if (fd_ < 0) return 0;
  if (state_ == State::kConnecting) return EPOLLOUT;
  return EPOLLIN | (written_ < queue_.size() ? EPOLLOUT : 0u);
}

RedisClock::time_point RedisConn::next_deadline() const noexcept {
  RedisClock::time_point t = RedisClock::time_point::max();
  if (state_ == State::kConnecting) t = connect_deadline_;
  if (state_ == State::kBackoff) t = backoff_until_;
  for (const Entry& e : queue_) {
    if (e.request != nullptr) t = std::min(t, e.request->deadline);
  }
  return t;
}

// ---- connecting ----------------------------------------------------------------------------

Status RedisConn::start_connect(RedisClock::time_point now) noexcept {
  sockaddr_storage addr;
  socklen_t len = 0;
  if (!socket_address(endpoint_, &addr, &len))
    return Status(Code::kInvalidArgument, "redis host is not a numeric address");
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::from_errno("redis socket", errno);
  if (addr.ss_family != AF_UNIX) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), len);
  if (rc != 0 && errno != EINPROGRESS && errno != EAGAIN) {
    int err = errno;
    close(fd);
    backoff_ = std::clamp(backoff_ * 2, options_.backoff_min, options_.backoff_max);
    backoff_until_ = now + backoff_;
    state_ = State::kBackoff;
    last_failure_ = Status::from_errno("redis connect", err);
    ++counters_.connection_failures;
    return Status(Code::kUnavailable, "redis server refused the connection");
  }
  fd_ = fd;
  ++generation_;
  ++counters_.connects;
  state_ = State::kConnecting;
  connect_deadline_ = now + options_.connect_timeout;
  last_read_ = now;
  parser_.reset();
  queue_auth();
  return OkStatus();
}

void RedisConn::queue_auth() {
  if (auth_command_.empty()) return;
  // Nothing is written yet on a new socket, so AUTH can go in front of what is queued.
  queue_.push_front(Entry{nullptr, Kind::kAuth, false, false, {}});
}

void RedisConn::finish_connect(RedisClock::time_point now) noexcept {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) {
    last_failure_ = Status::from_errno("redis connect", err);
    return fail_connection(Status(Code::kUnavailable, "redis connect failed"));
  }
  state_ = State::kReady;
  last_read_ = now;
}

// ---- writing -------------------------------------------------------------------------------

void RedisConn::on_writable(RedisClock::time_point now) noexcept {
  now_ = now;
  if (state_ == State::kConnecting) finish_connect(now);
  if (state_ == State::kReady) write_some(now);
}

// iovecs for the unwritten bytes of the queue, from queue_[written_] at write_offset_.
size_t RedisConn::gather(iovec* iov, size_t max) const noexcept {
  size_t n = 0, skip = write_offset_;
  for (size_t i = written_; i < queue_.size() && n + 4 <= max; ++i) {
    const Entry& e = queue_[i];
    std::string_view parts[4];
    size_t count = 0;
    if (e.kind == Kind::kAuth) {
      parts[count++] = auth_command_;
    } else {
      const RedisRequest& r = *e.request;
      if (e.asking) parts[count++] = kAsking;
      parts[count++] = r.command;
      if (r.payload_follows) {
        parts[count++] = std::string_view(reinterpret_cast<const char*>(r.payload.data()), r.payload.size());
        parts[count++] = resp::kCrlf;
      }
    }
    for (size_t k = 0; k < count; ++k) {
      std::string_view p = parts[k];
      if (skip >= p.size()) {
        skip -= p.size();
        continue;
      }
      p.remove_prefix(skip);
      skip = 0;
      iov[n++] = iovec{const_cast<char*>(p.data()), p.size()};
    }
  }
  return n;
}

void RedisConn::write_some(RedisClock::time_point now) noexcept {
  while (written_ < queue_.size()) {
    iovec iov[kMaxIov];
    size_t n = gather(iov, kMaxIov);
    if (n == 0) {  // only empty parts left: every remaining entry is written
      advance_written(0, now);
      continue;
    }
    // sendmsg with MSG_NOSIGNAL rather than writev: a server that died leaves a socket whose
    // write must fail with EPIPE, not raise SIGPIPE in a process that never ignored it.
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t w = sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      last_failure_ = Status::from_errno("redis write", errno);
      return fail_connection(Status(Code::kUnavailable, "redis write failed"));
    }
    advance_written(static_cast<size_t>(w), now);
  }
}

// Moves the write position `n` bytes on, marking entries written as their last byte goes.
void RedisConn::advance_written(size_t n, RedisClock::time_point now) noexcept {
  write_offset_ += n;
  while (written_ < queue_.size()) {
    Entry& e = queue_[written_];
    size_t size = 0;
    if (e.kind == Kind::kAuth) {
      size = auth_command_.size();
    } else {
      size = (e.asking ? kAsking.size() : 0) + e.request->command.size() +
             (e.request->payload_follows ? e.request->payload.size() + 2 : 0);
    }
    if (write_offset_ < size) return;
    write_offset_ -= size;
    e.sent_at = now;
    ++written_;
  }
}

// ---- reading -------------------------------------------------------------------------------

void RedisConn::on_readable(RedisClock::time_point now) noexcept {
  now_ = now;
  if (state_ == State::kConnecting) finish_connect(now);
  size_t budget = kReadBudget;
  while (budget > 0 && state_ == State::kReady) {
    size_t got = read_some(now, budget);
    if (got == 0) return;
    budget -= std::min(budget, got);
  }
}

// One read(): straight into a sink's destination when a sunk bulk is being received, else
// into the read buffer and through the parser. Returns the bytes read; 0 when there is
// nothing more to read now (or the connection failed).
size_t RedisConn::read_some(RedisClock::time_point now, size_t budget) noexcept {
  std::span<std::byte> space = parser_.direct_space();
  bool into_sink = !space.empty();
  if (!into_sink) {
    if (read_buffer_.size() < kReadChunk) read_buffer_.resize(kReadChunk);
    space = read_buffer_;
  }
  ssize_t got = read(fd_, space.data(), std::min(space.size(), budget));
  if (got < 0) {
    if (errno == EAGAIN || errno == EINTR) return 0;
    last_failure_ = Status::from_errno("redis read", errno);
    fail_connection(Status(Code::kUnavailable, "redis read failed"));
    return 0;
  }
  if (got == 0) {
    last_failure_ = Status(Code::kUnavailable, "redis server closed the connection");
    fail_connection(last_failure_);
    return 0;
  }
  last_read_ = now;
  if (into_sink) {
    parser_.commit_direct(static_cast<size_t>(got));
    return static_cast<size_t>(got);
  }
  return feed(std::span<const std::byte>(space.data(), static_cast<size_t>(got))) ? static_cast<size_t>(got) : 0;
}

bool RedisConn::feed(std::span<const std::byte> bytes) noexcept {
  while (!bytes.empty()) {
    if (written_ == 0) {
      fail_connection(Status(Code::kProtocol, "redis server sent a reply nobody asked for"));
      return false;
    }
    resp::ParseResult r = parser_.feed(bytes, front_sink());
    bytes = bytes.subspan(r.consumed);
    if (r.state == resp::ParseState::kError) {
      last_failure_ = parser_.error();
      fail_connection(parser_.error());
      return false;
    }
    if (r.state == resp::ParseState::kDone && !deliver_front()) return false;
  }
  return true;
}

resp::BulkSink* RedisConn::front_sink() noexcept {
  const Entry& e = queue_.front();
  if (e.asking || e.kind != Kind::kRequest) return nullptr;
  if (e.abandoned) return &g_discard;
  return e.request->sink;
}

// The front entry's reply is complete: hand it over. False if the connection failed.
bool RedisConn::deliver_front() noexcept {
  Entry& e = queue_.front();
  const resp::Reply& reply = parser_.reply();
  ++counters_.replies;
  backoff_ = std::chrono::milliseconds(0);
  if (e.asking) {  // ASKING's +OK; the command's own reply follows
    e.asking = false;
    parser_.next();
    return true;
  }
  if (e.kind == Kind::kAuth && reply.is_error()) {
    last_failure_ = Status(Code::kPermission, "redis refused AUTH");
    fail_connection(last_failure_);
    return false;
  }
  RedisRequest* r = e.request;  // null if abandoned
  queue_.pop_front();
  --written_;
  if (r != nullptr) complete(r, OkStatus(), &reply);
  parser_.next();
  return state_ == State::kReady;
}

// ---- deadlines and failures ----------------------------------------------------------------

void RedisConn::on_timer(RedisClock::time_point now) noexcept {
  now_ = now;
  if (state_ == State::kBackoff && now >= backoff_until_) state_ = State::kIdle;
  if (state_ == State::kConnecting && now >= connect_deadline_) {
    last_failure_ = Status(Code::kTimeout, "redis connect timed out");
    ++counters_.timeouts;
    return fail_connection(last_failure_);
  }
  expire(now);
}

// Requests past their deadline complete with kTimeout. One not yet written leaves the queue;
// one written is abandoned (its reply will be discarded); one partly written, or one after
// which the server sent nothing at all, takes the connection down with it.
void RedisConn::expire(RedisClock::time_point now) noexcept {
  std::vector<Completion> done;
  bool fatal = false;
  for (size_t i = 0; i < queue_.size() && !fatal;) {
    Entry& e = queue_[i];
    if (e.request == nullptr || e.request->deadline > now) {
      ++i;
      continue;
    }
    ++counters_.timeouts;
    if (i > written_ || (i == written_ && write_offset_ == 0)) {
      done.push_back({e.request, Status(Code::kTimeout, "redis request timed out (not sent)")});
      queue_.erase(queue_.begin() + static_cast<ptrdiff_t>(i));
      continue;
    }
    done.push_back({e.request, Status(Code::kTimeout, "redis request timed out")});
    e.request = nullptr;  // the caller may free it once told
    e.abandoned = true;
    if (i == 0) parser_.drop_sink();
    fatal = i == written_ || last_read_ < e.sent_at;
    ++i;
  }
  if (fatal) {
    last_failure_ = Status(Code::kTimeout, "redis server stalled");
    fail_connection(last_failure_);
  }
  complete_all(done);
}

void RedisConn::fail_connection(Status why) noexcept {
  std::vector<Completion> done;
  for (Entry& e : queue_) {
    if (e.kind == Kind::kRequest && e.request != nullptr) done.push_back({e.request, why});
  }
  queue_.clear();
  written_ = 0;
  write_offset_ = 0;
  parser_.reset();
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
    ++counters_.connection_failures;
    backoff_ = std::clamp(backoff_ * 2, options_.backoff_min, options_.backoff_max);
    backoff_until_ = now_ + backoff_;
    state_ = State::kBackoff;
  }
  complete_all(done);
}

void RedisConn::complete(RedisRequest* r, Status status, const resp::Reply* reply) noexcept {
  if (!status.ok()) ++counters_.failed;
  if (handler_ != nullptr) {
    handler_->on_reply(*r, status, status.ok() ? reply : nullptr);
  } else if (r->done) {
    r->done(*r, status, status.ok() ? reply : nullptr);
  }
}

void RedisConn::complete_all(std::vector<Completion>& done) noexcept {
  for (Completion& c : done) complete(c.request, c.status, nullptr);
}

}  // namespace kdn::sidecar
