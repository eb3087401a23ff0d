// RedisConn and RedisCluster: a Redis client that lives on an event loop it does not own.
//
// RedisConn is one non-blocking socket (TCP or Unix) to one server. It never blocks and never
// sleeps: the owner watches fd() for events() and calls on_readable(), on_writable() and, at
// next_deadline(), on_timer(). Requests are pipelined in submission order:
//   - every request has a deadline and completes exactly once: with the reply, or with an
//     error status (kTimeout at its deadline, kUnavailable/kIo when the connection fails,
//     kPermission when AUTH is refused, kProtocol when the server sends garbage);
//   - a request that times out after it was written cannot be recalled: its reply is read
//     and thrown away when it comes, and its sink is never written again. If nothing at all
//     arrived since it was sent, the server is taken as stalled and the connection is closed;
//   - on connect, AUTH goes first when a password is configured (pipelined with whatever was
//     submitted meanwhile; refused, everything fails);
//   - after a failure every request still queued fails at once, and so does each request
//     submitted during a backoff (doubling from backoff_min to backoff_max); the first
//     request after it reconnects. Nothing waits for a server that is down.
// A request's bulk replies may go to its sink (resp.h): read() lands straight in the sink's
// destination once a bulk's header has arrived.
//
// RedisCluster routes requests by key over a connection pool per master, following the
// cluster specification: the slot map comes from CLUSTER SLOTS; "MOVED" updates the map,
// retries at the named node and schedules a refresh (at most one per refresh_interval);
// "ASK" retries once at the named node behind ASKING; at most max_redirects per request.
// A failed connection also schedules a refresh, which is how a replica's promotion is found.
// Standalone mode is a cluster of one node that owns every slot and is never refreshed.
// It keeps its sockets in an epoll set of its own: the owner adds fd() to its loop and calls
// poll() when it is readable or next_deadline() has passed.
//
// Ownership: the caller owns each RedisRequest (and its payload, and its sink's destinations)
// until its completion ran. Completions run inside submit() (an immediate failure),
// on_readable()/on_timer()/poll() and the destructors (kUnavailable), on the owner's thread.
// A completion may submit new requests (not while the client is being destroyed: those fail
// at once); it must not destroy the connection or cluster.
// Thread safety: none; one thread (the event loop).
#pragma once

#include "redis_cluster.h"
#include "resp.h"

#include <kdn/common/status.h>

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kdn::sidecar {

using RedisClock = std::chrono::steady_clock;

struct RedisRequest {
  // Set by the caller; untouched by the client.
  std::string command;                 // RESP bytes (resp::append_command, or _head)
  bool payload_follows = false;        // `command` came from append_command_head
  std::span<const std::byte> payload;  // then: sent after `command`, followed by CRLF
  resp::BulkSink* sink = nullptr;      // where bulk replies go (null: into the reply)
  RedisClock::time_point deadline{};
  // Completion: `reply` is null unless `status` is ok (an error *reply*, such as OOM or
  // WRONGTYPE, is a reply: status ok, reply->is_error()). It is valid during the call only.
  std::function<void(RedisRequest&, Status status, const resp::Reply* reply)> done;
  // Set by RedisCluster.
  uint16_t slot = 0;
  uint8_t redirects = 0;
  bool asking = false;  // send ASKING first (an ASK redirect)
};

// Who hears of a connection's completions (RedisCluster); without one, request.done does.
class ReplyHandler {
 public:
  virtual ~ReplyHandler() = default;
  virtual void on_reply(RedisRequest& r, Status status, const resp::Reply* reply) noexcept = 0;
};

struct RedisEndpoint {
  NodeAddress tcp;        // numeric address (or "localhost")
  std::string unix_path;  // when set, a Unix socket instead of tcp
};

struct RedisConnOptions {
  std::string username;  // ACL user for AUTH ("": the default user)
  std::string password;  // "": no AUTH
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds backoff_min{50};
  std::chrono::milliseconds backoff_max{2000};
  resp::Limits limits;
};

struct RedisConnCounters {
  uint64_t submitted = 0, replies = 0, timeouts = 0, failed = 0, connects = 0, connection_failures = 0;
};

class RedisConn {
 public:
  enum class State : uint8_t { kIdle, kConnecting, kReady, kBackoff };

  RedisConn(RedisEndpoint endpoint, const RedisConnOptions& options, ReplyHandler* handler = nullptr);
  ~RedisConn();
  RedisConn(const RedisConn&) = delete;
  RedisConn& operator=(const RedisConn&) = delete;

  // Queues `r` (connecting first if needed); fails it at once during a backoff.
  void submit(RedisRequest* r, RedisClock::time_point now) noexcept;

  int fd() const noexcept { return fd_; }
  // Changes whenever fd() is a new socket (an fd number can be reused).
  uint64_t socket_generation() const noexcept { return generation_; }
  // EPOLLIN/EPOLLOUT as wanted now (0 without a socket).
  uint32_t events() const noexcept;
  void on_readable(RedisClock::time_point now) noexcept;
  void on_writable(RedisClock::time_point now) noexcept;
  void on_timer(RedisClock::time_point now) noexcept;
  // The earliest request deadline, connect deadline or backoff end (max() if none).
  RedisClock::time_point next_deadline() const noexcept;

  State state() const noexcept { return state_; }
  size_t queued() const noexcept { return queue_.size(); }
  const RedisEndpoint& endpoint() const noexcept { return endpoint_; }
  const RedisConnCounters& counters() const noexcept { return counters_; }
  // Why the connection last failed (ok if it never did).
  Status last_failure() const noexcept { return last_failure_; }

 private:
  enum class Kind : uint8_t { kRequest, kAuth };
  struct Entry {
    RedisRequest* request = nullptr;  // null: internal, or abandoned after its deadline
    Kind kind = Kind::kRequest;
    bool asking = false;  // an ASKING reply comes first
    bool abandoned = false;
    RedisClock::time_point sent_at{};
  };
  struct Completion {
    RedisRequest* request;
    Status status;
  };

  Status start_connect(RedisClock::time_point now) noexcept;
  void finish_connect(RedisClock::time_point now) noexcept;
  void queue_auth();
  void write_some(RedisClock::time_point now) noexcept;
  size_t gather(::iovec* iov, size_t max) const noexcept;
  void advance_written(size_t n, RedisClock::time_point now) noexcept;
  size_t read_some(RedisClock::time_point now, size_t budget) noexcept;
  bool feed(std::span<const std::byte> bytes) noexcept;
  resp::BulkSink* front_sink() noexcept;
  bool deliver_front() noexcept;
  void expire(RedisClock::time_point now) noexcept;
  void fail_connection(Status why) noexcept;
  void complete(RedisRequest* r, Status status, const resp::Reply* reply) noexcept;
  void complete_all(std::vector<Completion>& done) noexcept;

  RedisEndpoint endpoint_;
  RedisConnOptions options_;
  ReplyHandler* handler_;
  int fd_ = -1;
  uint64_t generation_ = 0;
  State state_ = State::kIdle;
  RedisClock::time_point connect_deadline_{}, backoff_until_{}, last_read_{}, now_{};
  std::chrono::milliseconds backoff_{0};
  std::deque<Entry> queue_;  // in submission order; replies complete the front
  size_t written_ = 0;       // entries at the front that are fully written
  size_t write_offset_ = 0;  // bytes of queue_[written_] already written
  resp::Parser parser_;
  std::vector<std::byte> read_buffer_;
  std::string auth_command_;
  RedisConnCounters counters_;
  Status last_failure_;
};

struct RedisClusterOptions {
  std::vector<NodeAddress> seeds;  // cluster: any of its nodes; standalone: the server
  std::string unix_path;           // standalone only: connect here instead
  bool cluster = true;
  uint32_t pool_size = 1;  // connections per master
  uint32_t max_redirects = 5;
  std::chrono::milliseconds refresh_interval{100};  // the least time between two CLUSTER SLOTS
  std::chrono::milliseconds refresh_timeout{1000};
  RedisConnOptions conn;
};

class RedisCluster final : private ReplyHandler {
 public:
  // Creates the client and its epoll set; connects on the first request (cluster: asks a
  // seed for the slot map first, holding requests until it comes or their deadline; a seed
  // that refuses CLUSTER SLOTS fails them at once, refresh_status() says why).
  static Result<std::unique_ptr<RedisCluster>> create(RedisClusterOptions options) noexcept;
  ~RedisCluster() override;

  // Routes `r` by the slot of `key`.
  void submit(RedisRequest* r, std::string_view key, RedisClock::time_point now) noexcept;
  // Readable when a connection has work; then, or at next_deadline(), call poll().
  int fd() const noexcept { return epoll_fd_; }
  void poll(RedisClock::time_point now) noexcept;
  RedisClock::time_point next_deadline() const noexcept;

  // The slot map in use (null before the first one); tests may replace it to force redirects.
  const SlotMap* slot_map() const noexcept { return map_ ? &*map_ : nullptr; }
  void replace_slot_map(SlotMap map) noexcept;
  // Why the last slot map refresh failed (ok if the last one succeeded).
  Status refresh_status() const noexcept { return refresh_status_; }
  uint64_t refreshes() const noexcept { return refreshes_; }
  uint64_t redirects() const noexcept { return redirects_; }

 private:
  struct Member;  // a connection and its place in the epoll set
  struct Pool {
    NodeAddress node;
    std::vector<std::unique_ptr<Member>> members;
  };

  explicit RedisCluster(RedisClusterOptions options, int epoll_fd);
  void on_reply(RedisRequest& r, Status status, const resp::Reply* reply) noexcept override;
  bool follow_redirect(RedisRequest& r, const resp::Reply& reply) noexcept;
  void route(RedisRequest* r, RedisClock::time_point now) noexcept;
  void send_to(const NodeAddress& node, RedisRequest* r, RedisClock::time_point now) noexcept;
  void finish(RedisRequest& r, Status status, const resp::Reply* reply) noexcept;
  Pool& pool_for(const NodeAddress& node);
  void want_refresh() noexcept { refresh_wanted_ = true; }
  void maybe_refresh(RedisClock::time_point now) noexcept;
  void refresh_done(Status status, const resp::Reply* reply) noexcept;
  void release_parked(RedisClock::time_point now, Status failure) noexcept;
  void expire_parked(RedisClock::time_point now) noexcept;
  void sync_epoll() noexcept;

  RedisClusterOptions options_;
  int epoll_fd_;
  std::vector<std::unique_ptr<Pool>> pools_;
  std::optional<SlotMap> map_;
  std::deque<RedisRequest*> parked_;  // waiting for the first slot map
  RedisRequest refresh_request_;
  NodeAddress refresh_target_;
  bool refresh_in_flight_ = false;
  bool refresh_wanted_ = false;
  bool closing_ = false;
  size_t refresh_rotation_ = 0;
  RedisClock::time_point last_refresh_{};
  Status refresh_status_;
  uint64_t refreshes_ = 0, redirects_ = 0;
  RedisClock::time_point now_{};
};

}  // namespace kdn::sidecar
