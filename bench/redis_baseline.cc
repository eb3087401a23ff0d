// The redis baseline: a private redis-server on loopback, chunk-sized SET and GET through
// hiredis. This is what a shared KV store over TCP delivers to an engine on the same node.
#include "baselines.h"

#include "page_buffer.h"
#include "process.h"

#include <kdn/common/clock.h>

#if KDN_BENCH_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#endif

namespace kdn::bench {

#if !KDN_BENCH_HAVE_HIREDIS

Result<RedisResult> redis_gbps(const RedisOptions&) noexcept {
  return Status(Code::kUnavailable, "kdn-bench was built without hiredis");
}

#else

namespace {

constexpr auto kStartupTimeout = std::chrono::seconds(10);
constexpr int kStartAttempts = 3;

struct ContextFree {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using RedisConnection = std::unique_ptr<redisContext, ContextFree>;

struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

template <class... Args>
Reply command(redisContext* c, const char* format, Args... args) {
  return Reply(static_cast<redisReply*>(redisCommand(c, format, args...)));
}

// A loopback port nobody listens on right now (the server may still lose a race for it;
// the caller retries with another port).
Result<int> pick_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::from_errno("socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  if (rc == 0) rc = getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int err = errno;
  close(fd);
  if (rc != 0) return Status::from_errno("bind loopback port", err);
  return static_cast<int>(ntohs(addr.sin_port));
}

// A running redis-server and a connection to it; stopped and cleaned up on destruction.
class RedisServer {
 public:
  static Result<std::unique_ptr<RedisServer> > start(uint64_t max_value_bytes);
  ~RedisServer();
  redisContext* connection() { return conn_.get(); }

 private:
  RedisServer(TempDir dir, ChildProcess proc) : dir_(std::move(dir)), proc_(std::move(proc)) {}
  Status wait_until_ready(int port);

  TempDir dir_;
  ChildProcess proc_;
  RedisConnection conn_;
};

std::vector<std::string> server_command(const std::string& binary, const std::string& dir, int port,
                                        uint64_t max_value_bytes) {
  uint64_t bulk = std::max<uint64_t>(512ull << 20, 2 * max_value_bytes);
  return {binary,
          "--save",
          "",
          "--appendonly",
          "no",
          "--port",
          std::to_string(port),
          "--bind",
          "127.0.0.1",
          "--dir",
          dir,
          "--daemonize",
          "no",
          "--proto-max-bulk-len",
          std::to_string(bulk),
          "--client-query-buffer-limit",
          std::to_string(2 * bulk)};
}

Result<std::unique_ptr<RedisServer> > RedisServer::start(uint64_t max_value_bytes) {
  std::string binary = find_on_path("redis-server");
  if (binary.empty()) return Status(Code::kUnavailable, "redis-server is not installed");
  Status last(Code::kUnavailable, "redis-server did not start");
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    Result<TempDir> dir = TempDir::create("kdn-bench-redis");
    if (!dir.ok()) return dir.status();
    Result<int> port = pick_free_port();
    if (!port.ok()) return port.status();
    std::vector<std::string> argv = server_command(binary, dir->path(), *port, max_value_bytes);
    Result<ChildProcess> proc = spawn_program(argv, dir->path() + "/redis.log");
    if (!proc.ok()) return proc.status();
    std::unique_ptr<RedisServer> server(new RedisServer(std::move(dir).value(), std::move(proc).value()));
    last = server->wait_until_ready(*port);
    if (last.ok()) return server;
  }
  return last;
}

Status RedisServer::wait_until_ready(int port) {
  auto deadline = std::chrono::steady_clock::now() + kStartupTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!proc_.running()) return Status(Code::kUnavailable, "redis-server exited at startup");
    timeval connect_timeout{0, 200'000};
    RedisConnection c(redisConnectWithTimeout("127.0.0.1", port, connect_timeout));
    if (c && c->err == 0) {
      Reply pong = command(c.get(), "PING");
      if (pong && pong->type == REDIS_REPLY_STATUS && std::strcmp(pong->str, "PONG") == 0) {
        timeval op_timeout{30, 0};
        redisSetTimeout(c.get(), op_timeout);
        conn_ = std::move(c);
        return OkStatus();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status(Code::kTimeout, "redis-server did not answer PING");
}

RedisServer::~RedisServer() {
  if (conn_) {
    // The server closes the connection instead of answering; the reply is null.
    Reply ignored = command(conn_.get(), "SHUTDOWN NOSAVE");
    conn_.reset();
  }
  (void)proc_.stop(SIGTERM, std::chrono::seconds(5));
}

std::string value_key(size_t i) { return "kdn-bench:chunk:" + std::to_string(i); }

// Stamps slot i of the engine buffer with i, so a GET can prove it got the right value.
void stamp_slot(PageBuffer& engine, uint64_t value_bytes, size_t i) {
  uint64_t stamp = i;
  std::memcpy(engine.data() + i * value_bytes, &stamp, sizeof stamp);
}

Result<uint64_t> timed_sets(redisContext* c, PageBuffer& engine, uint64_t value_bytes, size_t values) {
  for (size_t i = 0; i < values; ++i) stamp_slot(engine, value_bytes, i);
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < values; ++i) {
    std::string key = value_key(i);
    Reply r = command(c, "SET %b %b", key.data(), key.size(), engine.data() + i * value_bytes,
                      static_cast<size_t>(value_bytes));
    if (!r || r->type != REDIS_REPLY_STATUS) return Status(Code::kIo, "redis SET failed");
  }
  return now_ns() - t0;
}

// GETs every key into its engine-buffer slot (a retrieve ends with the bytes there).
Result<uint64_t> timed_gets(redisContext* c, PageBuffer& engine, uint64_t value_bytes, size_t values) {
  std::memset(engine.data(), 0, engine.size());
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < values; ++i) {
    std::string key = value_key(i);
    Reply r = command(c, "GET %b", key.data(), key.size());
    if (!r || r->type != REDIS_REPLY_STRING || r->len != value_bytes) {
      return Status(Code::kIo, "redis GET failed or returned a wrong-sized value");
    }
    std::memcpy(engine.data() + i * value_bytes, r->str, value_bytes);
  }
  uint64_t elapsed = now_ns() - t0;
  for (size_t i = 0; i < values; ++i) {
    uint64_t stamp = 0;
    std::memcpy(&stamp, engine.data() + i * value_bytes, sizeof stamp);
    if (stamp != i) return Status(Code::kCorrupt, "redis GET returned another key's value");
  }
  return elapsed;
}

}  // namespace

Result<RedisResult> redis_gbps(const RedisOptions& options) noexcept {
  if (options.value_bytes < sizeof(uint64_t) || options.get_passes <= 0) {
    return Status(Code::kInvalidArgument, "redis baseline needs a value size and passes");
  }
  size_t values = static_cast<size_t>(std::max<uint64_t>(4, options.total_bytes / options.value_bytes));
  Result<PageBuffer> engine = PageBuffer::allocate(values * options.value_bytes, true);
  if (!engine.ok()) return engine.status();
  engine->fill_pattern(7);
  Result<std::unique_ptr<RedisServer> > server = RedisServer::start(options.value_bytes);
  if (!server.ok()) return server.status();
  redisContext* c = (*server)->connection();

  Result<uint64_t> set_ns = timed_sets(c, *engine, options.value_bytes, values);
  if (!set_ns.ok()) return set_ns.status();
  uint64_t get_ns = 0;
  for (int pass = 0; pass < options.get_passes; ++pass) {
    Result<uint64_t> ns = timed_gets(c, *engine, options.value_bytes, values);
    if (!ns.ok()) return ns.status();
    get_ns += *ns;
  }
  RedisResult r;
  uint64_t bytes = values * options.value_bytes;
  r.set_gbps = gb_per_s(bytes, *set_ns);
  r.get_gbps = gb_per_s(bytes * static_cast<uint64_t>(options.get_passes), get_ns);
  r.value_bytes = options.value_bytes;
  r.values = values;
  r.get_passes = options.get_passes;
  return r;
}

#endif  // KDN_BENCH_HAVE_HIREDIS

}  // namespace kdn::bench
