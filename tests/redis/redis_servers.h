// Real redis-server processes for tests and kdn-bench: a standalone server and a Redis Cluster
// of masters with replicas, on free ports in a private directory, started from Debian's
// redis-server and redis-cli and stopped (SIGKILL, then reaped) when the object goes. Servers
// get PR_SET_PDEATHSIG, so they die with their parent even when it is killed outright.
//
// A cluster listens on loopback by default; ClusterOptions may bind it to another address and
// start its servers inside a network namespace (kdn-bench puts one behind a rate-limited link).
// redis-cli always runs in the caller's namespace and reaches the servers at that address.
//
// Ownership: each object owns its processes and its directory.
// Thread safety: none; one thread (the test's or the benchmark's).
#pragma once

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
  void kill9();              // SIGKILL and reap
  void pause(bool stopped);  // SIGSTOP / SIGCONT
};

struct ClusterOptions {
  int masters = 3;
  int replicas = 1;                // per master
  std::string host = "127.0.0.1";  // numeric address every server binds and announces
  std::string netns;               // a network namespace (ip netns) to run them in; "": ours
  std::vector<std::string> extra;  // more redis-server arguments for every node
};

class RedisServers {
 public:
  // One standalone server; `extra` are more redis-server arguments ("{dir}" in one stands for
  // dir()). Null (with `why` set) if it did not start.
  static std::unique_ptr<RedisServers> standalone(std::vector<std::string> extra, std::string* why);
  // `masters` masters with `replicas` replicas each, a cluster_state:ok cluster.
  static std::unique_ptr<RedisServers> cluster(int masters, int replicas, std::string* why);
  static std::unique_ptr<RedisServers> cluster(const ClusterOptions& options, std::string* why);
  ~RedisServers();

  const std::string& dir() const { return dir_; }
  // The address the servers listen on.
  const std::string& host() const { return host_; }
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
  std::string host_ = "127.0.0.1";
  std::string netns_;
  std::vector<RedisServerProcess> servers_;
};

}  // namespace kdn::testing
