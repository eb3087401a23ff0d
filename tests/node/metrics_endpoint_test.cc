// The Prometheus endpoint (metrics_listen) seen by a local user who wants it, or kdnd, to stop
// serving: a client trickling its request a byte at a time, hundreds of idle connections, a
// connection that never speaks. Scrapes and engine sessions must go on, kdnd's descriptors
// must not grow with the attacker's connections, and kdnd raises its own soft open-file limit.
// Each test runs the real kdnd binary.
#include "kdnd_process.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kdn::testing {
namespace {

size_t open_fds(pid_t pid) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

// A scrape that must answer 200 within `ms`.
bool scrape_ok_within(uint16_t port, int ms) {
  const auto t0 = std::chrono::steady_clock::now();
  auto [code, body] = http_get(port, "/metrics");
  return code == 200 && body.find("kdn_sessions ") != std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(ms);
}

struct Endpoint {
  uint16_t port = free_port();
  KdndProcess d{{"--set", "metrics_listen=127.0.0.1:" + std::to_string(port), "--log-level", "info"}};
};

TEST(MetricsEndpoint, AClientTricklingItsRequestHoldsUpNoScrape) {
  Endpoint e;
  std::atomic<bool> stop{false};
  std::thread trickler([&] {
    const int s = connect_loopback(e.port);
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    for (size_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      const char c = i < req.size() ? req[i] : 'x';
      if (::send(s, &c, 1, MSG_NOSIGNAL) != 1) break;  // kdnd cut it off: fine
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::close(s);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(scrape_ok_within(e.port, 1000)) << "scrape " << i << " behind a trickling client";
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  stop = true;
  trickler.join();
}

TEST(MetricsEndpoint, AConnectionThatNeverSpeaksIsClosedAfterTheReadDeadline) {
  Endpoint e;
  const int s = connect_loopback(e.port, 6000);
  ASSERT_GE(s, 0);
  const auto t0 = std::chrono::steady_clock::now();
  char c;
  const ssize_t n = ::recv(s, &c, 1, 0);  // 0 once kdnd closes it; -1 (EAGAIN) if it never does
  const auto waited = std::chrono::steady_clock::now() - t0;
  ::close(s);
  EXPECT_EQ(n, 0);
  EXPECT_LT(waited, std::chrono::milliseconds(4000));
}

TEST(MetricsEndpoint, IdleConnectionsAreCappedAndEnginesStillConnect) {
  Endpoint e;
  const size_t before = open_fds(e.d.pid());
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i)
    if (int s = connect_loopback(e.port); s >= 0) idle.push_back(s);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // kdnd accepts what it will
  const size_t during = open_fds(e.d.pid());
  EXPECT_LE(during, before + 40) << "kdnd holds a descriptor per idle connection: " << before << " -> " << during;
  EXPECT_TRUE(scrape_ok_within(e.port, 1000)) << "a scrape behind 300 idle connections";
  Conn k(e.d, tiny_model());
  EXPECT_TRUE(k.ok()) << "an engine session behind 300 idle connections";
  for (int s : idle) ::close(s);
}

// Soft RLIMIT_NOFILE as /proc/pid/limits says: "Max open files  SOFT  HARD  files".
std::pair<std::string, std::string> fd_limits(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/limits");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Max open files", 0) != 0) continue;
    std::istringstream in(line.substr(14));
    std::string soft, hard;
    in >> soft >> hard;
    return {soft, hard};
  }
  return {};
}

TEST(MetricsEndpoint, KdndRaisesItsSoftOpenFileLimitToTheHardOne) {
  rlimit mine{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &mine), 0);
  if (mine.rlim_max < 2048) GTEST_SKIP() << "the hard limit leaves nothing to raise";
  rlimit low = mine;
  low.rlim_cur = 1024;  // what kdnd inherits, as from a shell or a unit without LimitNOFILE
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  KdndProcess d;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &mine), 0);
  const auto [soft, hard] = fd_limits(d.pid());
  EXPECT_EQ(soft, hard);
  EXPECT_NE(soft, "1024");
}

}  // namespace
}  // namespace kdn::testing
