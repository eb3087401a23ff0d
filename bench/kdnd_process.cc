#include "kdnd_process.h"

#include <kdn/kdn.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <thread>
#include <vector>

namespace kdn::bench {
namespace {

constexpr auto kStartupTimeout = std::chrono::seconds(120);  // pre-faulting a large arena
constexpr auto kStopGrace = std::chrono::seconds(15);

// True if a full client handshake and one ring round trip succeed and the default
// namespace's arena is pre-faulted (a benchmark must not time page faults kdnd is still
// taking in the background).
bool ready(const std::string& socket_path) {
  kdn_connect_opts opts{};
  opts.struct_size = sizeof opts;
  opts.socket_path = socket_path.c_str();
  opts.timeout_ms = 1000;
  kdn_client* client = nullptr;
  if (kdn_connect(&opts, &client) != KDN_OK) return false;
  kdn_stats s{};
  s.struct_size = sizeof s;
  bool ok = kdn_ping(client) == KDN_OK && kdn_get_stats(client, &s) == KDN_OK && s.host_prefault_left_bytes == 0;
  kdn_disconnect(client);
  return ok;
}

}  // namespace

Result<KdndProcess> KdndProcess::start(const KdndOptions& options) noexcept {
  if (access(options.binary.c_str(), X_OK) != 0) {
    return Status::from_errno("kdnd binary not found (build target kdnd or pass --kdnd)", errno);
  }
  std::vector<std::string> argv = {options.binary, "--socket", options.socket_path, "--host-arena-bytes",
                                   std::to_string(options.host_arena_bytes)};
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  Result<ChildProcess> child = spawn_program(argv, options.log_path);
  if (!child.ok()) return child.status();
  KdndProcess kdnd(std::move(child).value());
  KDN_RETURN_IF_ERROR(kdnd.wait_until_ready(options.socket_path));
  return kdnd;
}

Status KdndProcess::wait_until_ready(const std::string& socket_path) noexcept {
  auto deadline = std::chrono::steady_clock::now() + kStartupTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process_.running()) return Status(Code::kUnavailable, "kdnd exited at startup");
    struct stat st;
    if (stat(socket_path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && ready(socket_path)) {
      return OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status(Code::kTimeout, "kdnd did not answer on its socket in time");
}

Result<int> KdndProcess::stop() noexcept { return process_.stop(SIGTERM, kStopGrace); }

Result<int> KdndProcess::kill() noexcept { return process_.stop(SIGKILL, kStopGrace); }

std::string default_kdnd_path() {
  std::vector<char> buf(4096);
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return "kdnd";
  std::string self(buf.data(), static_cast<size_t>(n));
  size_t slash = self.rfind('/');
  return slash == std::string::npos ? "kdnd" : self.substr(0, slash + 1) + "kdnd";
}

}  // namespace kdn::bench
