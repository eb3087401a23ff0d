// Real redis-server processes for tests: a standalone server and a Redis Cluster of masters
// with replicas, on free loopback ports in a private directory, started from Debian's
// redis-server and redis-cli and stopped (SIGKILL, then reaped) when the object goes.
//
// Ownership: each object owns its processes and its directory.
// Thread safety: none; one test thread.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace kdn::testing {

// Why redis cannot be tested here ("" if redis-server and redis-cli are installed).
std::string redis_missing();

struct RedisServerProcess {
  int port = 0;
  pid_t pid = -1;
  std::string log;
  bool running() const { return pid > 0; }
  void kill9();                 // SIGKILL and reap
  void pause(bool stopped);     // SIGSTOP / SIGCONT
};

class RedisServers {
 public:
  // One standalone server; `extra` are more redis-server arguments ("{dir}" in one stands for
  // dir()). Null (with `why` set) if it did not start.
  static std::unique_ptr<RedisServers> standalone(std::vector<std::string> extra, std::string* why);
  // `masters` masters with `replicas` replicas each, a cluster_state:ok cluster.
  static std::unique_ptr<RedisServers> cluster(int masters, int replicas, std::string* why);
  ~RedisServers();

  const std::string& dir() const { return dir_; }
  std::vector<RedisServerProcess>& servers() { return servers_; }
  RedisServerProcess* by_port(int port);
  // Runs redis-cli against `port` with `args`; its output ("" on failure).
  std::string cli(int port, const std::string& args) const;
  // Waits up to `seconds` until every running node reports cluster_state:ok.
  bool wait_cluster_ok(double seconds) const;
  // Waits up to `seconds` until every running replica has its master link up and synced.
  bool wait_replicas_synced(double seconds) const;

 private:
  RedisServers() = default;
  bool start_server(std::vector<std::string> args, int port);
  std::string dir_;
  std::vector<RedisServerProcess> servers_;
};

// The fixture base of a test suite whose cases share one cluster of 3 masters with a replica
// each, started once per suite (a cluster takes seconds to form) and stopped after its last
// case. `Suite` is the deriving fixture, so every suite has a cluster of its own. Without
// redis, servers_ stays null (the fixture's SetUp skips).
template <class Suite>
class ClusterSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!redis_missing().empty()) return;
    servers_ = RedisServers::cluster(3, 1, &why_).release();
  }
  static void TearDownTestSuite() {
    delete servers_;
    servers_ = nullptr;
  }
  static inline RedisServers* servers_ = nullptr;
  static inline std::string why_;
};

}  // namespace kdn::testing
