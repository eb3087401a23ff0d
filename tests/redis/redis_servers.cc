#include "redis_servers.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

namespace kdn::testing {
namespace {

bool on_path(const char* program) {
  std::string cmd = std::string("command -v ") + program + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

bool port_free(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

// A loopback port whose cluster bus port (+10000) is free too.
int pick_port() {
  static std::mt19937 rng(std::random_device{}());
  for (int tries = 0; tries < 200; ++tries) {
    int port = 20000 + static_cast<int>(rng() % 20000);
    if (port_free(port) && port_free(port + 10000)) return port;
  }
  return 0;
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

}  // namespace

std::string redis_missing() {
  if (!on_path("redis-server")) return "redis-server is not installed (Debian: redis-server)";
  if (!on_path("redis-cli")) return "redis-cli is not installed (Debian: redis-tools)";
  return "";
}

void RedisServerProcess::kill9() {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  pid = -1;
}

void RedisServerProcess::pause(bool stopped) {
  if (pid > 0) kill(pid, stopped ? SIGSTOP : SIGCONT);
}

RedisServers::~RedisServers() {
  for (RedisServerProcess& s : servers_) s.kill9();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

RedisServerProcess* RedisServers::by_port(int port) {
  for (RedisServerProcess& s : servers_) {
    if (s.port == port) return &s;
  }
  return nullptr;
}

std::string RedisServers::cli(int port, const std::string& args) const {
  return run("timeout 30 redis-cli -h " + host_ + " -p " + std::to_string(port) + " " + args + " 2>&1");
}

bool RedisServers::start_server(std::vector<std::string> args, int port) {
  RedisServerProcess s;
  s.port = port;
  s.log = dir_ + "/redis-" + std::to_string(port) + ".log";
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!netns_.empty()) {
      int ns = open(("/run/netns/" + netns_).c_str(), O_RDONLY | O_CLOEXEC);
      if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) _exit(126);
      close(ns);
    }
    int log = open(s.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log >= 0) {
      dup2(log, 1);
      dup2(log, 2);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  s.pid = pid;
  servers_.push_back(s);
  for (int i = 0; i < 250; ++i) {          // up to 5 s
    std::string pong = cli(port, "PING");  // a server with a password answers NOAUTH
    if (pong.find("PONG") != std::string::npos || pong.find("NOAUTH") != std::string::npos) return true;
    if (waitpid(pid, nullptr, WNOHANG) == pid) {
      servers_.back().pid = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::unique_ptr<RedisServers> RedisServers::standalone(std::vector<std::string> extra, std::string* why) {
  std::unique_ptr<RedisServers> r(new RedisServers());
  char tmpl[] = "/tmp/kdn-redis-XXXXXX";
  if (!mkdtemp(tmpl)) return *why = "mkdtemp failed", nullptr;
  r->dir_ = tmpl;
  for (int attempt = 0; attempt < 3; ++attempt) {
    int port = pick_port();
    std::vector<std::string> args = {
        "redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir",        r->dir_,  "--daemonize",        "no"};
    for (std::string a : extra) {
      if (size_t at = a.find("{dir}"); at != std::string::npos) a.replace(at, 5, r->dir_);
      args.push_back(a);
    }
    if (r->start_server(args, port)) return r;
  }
  *why = "redis-server did not start";
  return nullptr;
}

std::unique_ptr<RedisServers> RedisServers::cluster(int masters, int replicas, std::string* why) {
  ClusterOptions o;
  o.masters = masters;
  o.replicas = replicas;
  return cluster(o, why);
}

std::unique_ptr<RedisServers> RedisServers::cluster(const ClusterOptions& o, std::string* why) {
  std::unique_ptr<RedisServers> r(new RedisServers());
  r->host_ = o.host;
  r->netns_ = o.netns;
  char tmpl[] = "/tmp/kdn-redis-cluster-XXXXXX";
  if (!mkdtemp(tmpl)) return *why = "mkdtemp failed", nullptr;
  r->dir_ = tmpl;
  std::string nodes;
  for (int i = 0; i < o.masters * (1 + o.replicas); ++i) {
    int port = pick_port();
    std::string p = std::to_string(port);
    std::vector<std::string> args = {"redis-server", "--port", p, "--bind", o.host, "--cluster-announce-ip", o.host,
                                     "--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + p + ".conf",
                                     "--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0",
                                     // Replicas keep up with tests that write hundreds of MiB at once.
                                     "--repl-backlog-size", "256mb", "--client-output-buffer-limit", "replica 0 0 0",
                                     "--repl-diskless-sync-delay", "0", "--save", "", "--appendonly", "no", "--dir",
                                     r->dir_, "--daemonize", "no"};
    // Without a password, protected mode refuses every client that is not on loopback.
    if (o.host != "127.0.0.1") args.insert(args.end(), {"--protected-mode", "no"});
    args.insert(args.end(), o.extra.begin(), o.extra.end());
    if (!r->start_server(args, port)) return *why = "redis-server (cluster node) did not start", nullptr;
    nodes += " " + o.host + ":" + p;
  }
  std::string out = run("timeout 60 redis-cli --cluster create" + nodes + " --cluster-replicas " +
                        std::to_string(o.replicas) + " --cluster-yes 2>&1");
  if (out.find("All 16384 slots covered") == std::string::npos)
    return *why = "redis-cli --cluster create: " + out, nullptr;
  if (!r->wait_cluster_ok(20)) return *why = "the cluster did not reach cluster_state:ok", nullptr;
  if (!r->wait_replicas_synced(20)) return *why = "a replica did not finish its first sync", nullptr;
  return r;
}

bool RedisServers::wait_replicas_synced(double seconds) const {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    bool all = true;
    for (const RedisServerProcess& s : servers_) {
      std::string info = cli(s.port, "INFO replication");
      bool replica = info.find("role:slave") != std::string::npos;
      if (!s.running() || !replica) continue;
      if (info.find("master_link_status:up") == std::string::npos ||
          info.find("master_sync_in_progress:0") == std::string::npos) {
        all = false;
      }
    }
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

bool RedisServers::wait_cluster_ok(double seconds) const {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    bool all = true;
    for (const RedisServerProcess& s : servers_) {
      if (s.running() && cli(s.port, "CLUSTER INFO").find("cluster_state:ok") == std::string::npos) all = false;
    }
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace kdn::testing
