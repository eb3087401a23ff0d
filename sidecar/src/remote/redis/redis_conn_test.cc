// RedisConn against a scripted fake server on loopback: what a real redis-server will not do
// on demand (garbage, a close mid-stream, a reply cut in half across a deadline).
#include "redis_conn.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

namespace kdn::sidecar {
namespace {

using namespace std::chrono_literals;

// Accepts one connection and runs `script` on it in a thread.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(int fd)> script) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(listen_fd_, 4), 0);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, script] {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      script(fd);
      close(fd);
    });
  }
  ~FakeServer() {
    shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    close(listen_fd_);
  }
  uint16_t port() const { return port_; }

 private:
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
};

// Reads until `n` bytes arrived (or the peer closed).
std::string read_bytes(int fd, size_t n) {
  std::string s;
  char buf[4096];
  while (s.size() < n) {
    ssize_t got = read(fd, buf, std::min(sizeof buf, n - s.size()));
    if (got <= 0) break;
    s.append(buf, static_cast<size_t>(got));
  }
  return s;
}

void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t w = write(fd, s.data(), s.size());
    if (w <= 0) return;
    s.remove_prefix(static_cast<size_t>(w));
  }
}

// Drives one connection the way an event loop would, until `done` or `limit`.
bool drive(RedisConn& c, const std::function<bool()>& done, std::chrono::milliseconds limit = 3000ms) {
  auto until = RedisClock::now() + limit;
  while (!done()) {
    if (RedisClock::now() >= until) return false;
    pollfd p{c.fd(), 0, 0};
    if (c.events() & EPOLLIN) p.events |= POLLIN;
    if (c.events() & EPOLLOUT) p.events |= POLLOUT;
    ::poll(&p, c.fd() >= 0 ? 1 : 0, 5);
    auto now = RedisClock::now();
    if (p.revents & (POLLOUT | POLLERR | POLLHUP)) c.on_writable(now);
    if (p.revents & (POLLIN | POLLERR | POLLHUP)) c.on_readable(now);
    c.on_timer(RedisClock::now());
  }
  return true;
}

struct Outcome {
  bool finished = false;
  Status status;
  std::string text;
  resp::Type type = resp::Type::kNil;
};

void prepare(RedisRequest& r, Outcome& o, std::vector<std::string_view> argv, std::chrono::milliseconds timeout) {
  resp::append_command(r.command, argv);
  r.deadline = RedisClock::now() + timeout;
  r.done = [&o](RedisRequest&, Status s, const resp::Reply* reply) {
    o.finished = true;
    o.status = s;
    if (reply) {
      o.type = reply->root().type;
      o.text = std::string(reply->text(reply->root()));
    }
  };
}

RedisEndpoint loopback(uint16_t port) { return RedisEndpoint{NodeAddress{"127.0.0.1", port}, ""}; }

constexpr std::string_view kPing = "*1\r\n$4\r\nPING\r\n";

TEST(RedisConn, GarbageFromTheServerFailsWhatIsQueued) {
  FakeServer server([](int fd) {
    read_bytes(fd, 2 * kPing.size());
    write_all(fd, "+PONG\r\n!garbage\r\n");
    read_bytes(fd, 1);  // until the client closes
  });
  RedisConn c(loopback(server.port()), RedisConnOptions{});
  RedisRequest a, b;
  Outcome oa, ob;
  prepare(a, oa, {"PING"}, 2000ms);
  prepare(b, ob, {"PING"}, 2000ms);
  c.submit(&a, RedisClock::now());
  c.submit(&b, RedisClock::now());
  ASSERT_TRUE(drive(c, [&] { return oa.finished && ob.finished; }));
  EXPECT_TRUE(oa.status.ok());
  EXPECT_EQ(oa.text, "PONG");
  EXPECT_EQ(ob.status.code(), Code::kProtocol) << ob.status.what();
  EXPECT_EQ(c.state(), RedisConn::State::kBackoff);
}

TEST(RedisConn, ServerClosingFailsAtOnceAndBacksOff) {
  FakeServer server([](int fd) { read_bytes(fd, kPing.size()); });
  RedisConnOptions o;
  o.backoff_min = 300ms;
  RedisConn c(loopback(server.port()), o);
  RedisRequest a, b;
  Outcome oa, ob;
  prepare(a, oa, {"PING"}, 5000ms);
  c.submit(&a, RedisClock::now());
  auto t0 = RedisClock::now();
  ASSERT_TRUE(drive(c, [&] { return oa.finished; }));
  EXPECT_EQ(oa.status.code(), Code::kUnavailable) << oa.status.what();
  EXPECT_LT(RedisClock::now() - t0, 1000ms);
  // During the backoff a request fails inside submit().
  prepare(b, ob, {"PING"}, 5000ms);
  c.submit(&b, RedisClock::now());
  EXPECT_TRUE(ob.finished);
  EXPECT_EQ(ob.status.code(), Code::kUnavailable);
  EXPECT_EQ(c.counters().connection_failures, 1u);
}

// A deadline passes while a bulk is half-way into the sink: the request times out, the sink
// is never written again, and the next request on the connection gets its own reply.
TEST(RedisConn, TimedOutBulkNeverReachesItsSinkAgain) {
  std::atomic<bool> timed_out{false};
  FakeServer server([&](int fd) {
    read_bytes(fd, 2 * kPing.size());
    write_all(fd, "$8\r\nAAAA");
    while (!timed_out) std::this_thread::sleep_for(1ms);
    write_all(fd, "BBBB\r\n+second\r\n");
    read_bytes(fd, 1);
  });
  RedisConn c(loopback(server.port()), RedisConnOptions{});
  struct Sink final : resp::BulkSink {
    std::string dest = std::string(8, '.');
    resp::BulkDestination bulk_destination(uint32_t, uint64_t n) noexcept override {
      return n == dest.size() ? resp::BulkDestination{reinterpret_cast<std::byte*>(dest.data()), false}
                              : resp::BulkDestination{nullptr, true};
    }
  } sink;
  RedisRequest a, b;
  Outcome oa, ob;
  prepare(a, oa, {"PING"}, 300ms);
  a.sink = &sink;
  prepare(b, ob, {"PING"}, 3000ms);
  c.submit(&a, RedisClock::now());
  c.submit(&b, RedisClock::now());
  ASSERT_TRUE(drive(c, [&] { return oa.finished; }));
  EXPECT_EQ(oa.status.code(), Code::kTimeout);
  std::string at_timeout = sink.dest;
  EXPECT_EQ(at_timeout, "AAAA....");
  timed_out = true;
  ASSERT_TRUE(drive(c, [&] { return ob.finished; }));
  EXPECT_TRUE(ob.status.ok()) << ob.status.what();
  EXPECT_EQ(ob.text, "second");
  EXPECT_EQ(sink.dest, at_timeout);
  EXPECT_EQ(c.state(), RedisConn::State::kReady);
}

TEST(RedisConn, AuthGoesFirstAndARefusalFailsEverything) {
  FakeServer server([](int fd) {
    std::string auth = "*3\r\n$4\r\nAUTH\r\n$4\r\nuser\r\n$2\r\npw\r\n";
    EXPECT_EQ(read_bytes(fd, auth.size()), auth);
    read_bytes(fd, kPing.size());
    write_all(fd, "-WRONGPASS invalid username-password pair\r\n-NOAUTH Authentication required.\r\n");
    read_bytes(fd, 1);
  });
  RedisConnOptions o;
  o.username = "user";
  o.password = "pw";
  RedisConn c(loopback(server.port()), o);
  RedisRequest a;
  Outcome oa;
  prepare(a, oa, {"PING"}, 2000ms);
  c.submit(&a, RedisClock::now());
  ASSERT_TRUE(drive(c, [&] { return oa.finished; }));
  EXPECT_EQ(oa.status.code(), Code::kPermission) << oa.status.what();
}

TEST(RedisConn, NumericHostsOnly) {
  RedisConn c(RedisEndpoint{NodeAddress{"redis.example", 6379}, ""}, RedisConnOptions{});
  RedisRequest a;
  Outcome oa;
  prepare(a, oa, {"PING"}, 2000ms);
  c.submit(&a, RedisClock::now());
  EXPECT_TRUE(oa.finished);
  EXPECT_EQ(oa.status.code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kdn::sidecar
