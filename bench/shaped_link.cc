#include "shaped_link.h"

#include "process.h"

#include <dirent.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace kdn::bench {
namespace {

constexpr const char* kPrefix = "kdnb";  // netns kdnb-<pid>, devices kdnb<pid>a / kdnb<pid>b

// The name of the namespace a signal handler unmounts ("" when none), as a path.
char g_netns_path[128];

// SIGINT/SIGTERM/SIGHUP: drop the namespace's name (its processes die with us: PDEATHSIG),
// then die of the signal as before. Only async-signal-safe calls.
void on_fatal_signal(int sig) {
  if (g_netns_path[0] != '\0') {
    ::umount2(g_netns_path, MNT_DETACH);
    ::unlink(g_netns_path);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_signal_cleanup() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;  // keep an ignore
    struct sigaction sa {};
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

// Runs a command line; its output (stdout and stderr) and whether it exited 0.
bool sh(const std::string& cmd, std::string* out = nullptr) {
  std::string text;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return false;
  char buf[1024];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
  const int rc = ::pclose(p);
  if (out) *out = text;
  return rc == 0;
}

// Links of runs that died without cleaning up (their pid is gone).
void remove_stale_links() {
  DIR* d = ::opendir("/run/netns");
  if (d == nullptr) return;
  std::vector<std::string> stale;
  const std::string prefix = std::string(kPrefix) + "-";
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH) stale.push_back(name);
  }
  ::closedir(d);
  for (const std::string& name : stale) {
    std::fprintf(stderr, "kdn-bench: removing the stale network namespace %s\n", name.c_str());
    const std::string pid = name.substr(prefix.size());
    (void)sh("ip link del " + std::string(kPrefix) + pid + "a");
    (void)sh("ip netns del " + name);
  }
}

std::string tbf(const ShapedLinkOptions& o) {
  const double rate_bits = o.rate_gbit * 1e9;
  uint64_t burst = o.burst_bytes;
  if (burst == 0) burst = std::max<uint64_t>(256 << 10, uint64_t(rate_bits / 8 / 1000));
  char line[160];
  std::snprintf(line, sizeof line, "root tbf rate %.0fbit burst %llu latency %ums", rate_bits,
                (unsigned long long)burst, o.latency_ms);
  return line;
}

}  // namespace

Result<std::unique_ptr<ShapedLink>> ShapedLink::create(const ShapedLinkOptions& options, std::string* why) noexcept {
  if (::geteuid() != 0) {
    *why = "a network namespace and tc need root";
    return Status(Code::kPermission, "a network namespace and tc need root");
  }
  for (const char* tool : {"ip", "tc"}) {
    if (find_on_path(tool).empty()) {
      *why = std::string(tool) + " is not installed (Debian: iproute2)";
      return Status(Code::kUnavailable, "iproute2 is not installed");
    }
  }
  if (options.rate_gbit <= 0) {
    *why = "the link rate must be positive";
    return Status(Code::kInvalidArgument, "the link rate must be positive");
  }
  install_signal_cleanup();
  remove_stale_links();

  std::unique_ptr<ShapedLink> link(new ShapedLink());
  link->options_ = options;
  const std::string pid = std::to_string(::getpid());
  link->netns_ = std::string(kPrefix) + "-" + pid;
  link->host_dev_ = std::string(kPrefix) + pid + "a";
  link->peer_dev_ = std::string(kPrefix) + pid + "b";
  const uint32_t base = (uint32_t(::getpid()) % 32768u) * 4;  // a /30 in 198.18.0.0/15
  const std::string net = "198." + std::to_string(18 + base / 65536) + "." + std::to_string(base / 256 % 256) + ".";
  link->local_ = net + std::to_string(base % 256 + 1);
  link->peer_ = net + std::to_string(base % 256 + 2);

  std::string out;
  if (!sh("ip netns add " + link->netns_, &out)) {
    *why = "ip netns add: " + out;
    return Status(Code::kUnavailable, "ip netns add failed");
  }
  link->created_ = true;
  std::snprintf(g_netns_path, sizeof g_netns_path, "/run/netns/%s", link->netns_.c_str());
  const std::string in_ns = "ip netns exec " + link->netns_ + " ";
  const std::string mtu = std::to_string(options.mtu);
  const std::string steps[] = {
      "ip link add " + link->host_dev_ + " type veth peer name " + link->peer_dev_ + " netns " + link->netns_,
      "ip link set " + link->host_dev_ + " mtu " + mtu,
      in_ns + "ip link set " + link->peer_dev_ + " mtu " + mtu,
      "ip addr add " + link->local_ + "/30 dev " + link->host_dev_,
      in_ns + "ip addr add " + link->peer_ + "/30 dev " + link->peer_dev_,
      "ip link set " + link->host_dev_ + " up",
      in_ns + "ip link set " + link->peer_dev_ + " up",
      in_ns + "ip link set lo up",
      "tc qdisc add dev " + link->host_dev_ + " " + tbf(options),
      in_ns + "tc qdisc add dev " + link->peer_dev_ + " " + tbf(options),
  };
  for (const std::string& step : steps) {
    if (!sh(step, &out)) {  // the destructor undoes the rest
      *why = step + ": " + out;
      return Status(Code::kUnavailable, "setting up the link failed");
    }
  }
  return link;
}

ShapedLink::~ShapedLink() {
  if (!created_) return;
  (void)sh("ip link del " + host_dev_);  // takes its peer with it
  (void)sh("ip netns del " + netns_);
  g_netns_path[0] = '\0';
}

std::string ShapedLink::describe() const {
  std::string host, peer;
  (void)sh("tc qdisc show dev " + host_dev_, &host);
  (void)sh("ip netns exec " + netns_ + " tc qdisc show dev " + peer_dev_, &peer);
  std::string all = host + peer;
  while (!all.empty() && (all.back() == '\n' || all.back() == ' ')) all.pop_back();
  return all;
}

}  // namespace kdn::bench
