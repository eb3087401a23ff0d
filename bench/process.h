// Child processes the benchmarks start: forked workers (echo and ping-pong peers, engine
// processes) and spawned daemons (kdnd, redis-server).
//
// Ownership: a ChildProcess owns its pid. Destroying one that still runs stops it (SIGTERM,
// then SIGKILL after a grace period) and reaps it, so no error path leaks a daemon. Children
// also get PR_SET_PDEATHSIG, so they die with the bench even if it is killed outright.
//
// Thread safety: none; create and stop children from one thread, and fork only while the
// process has no other threads (the memcpy baseline joins its threads before returning).
#pragma once

#include <kdn/common/status.h>

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kdn::bench {

class ChildProcess {
 public:
  ChildProcess() = default;
  explicit ChildProcess(pid_t pid) noexcept : pid_(pid) {}
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const noexcept { return pid_; }
  // True while the child has not exited (reaps it if it has).
  bool running() noexcept;
  // Waits up to `timeout` for the child to exit; its wait status, or kTimeout.
  Result<int> wait_for(std::chrono::milliseconds timeout) noexcept;
  // Sends `sig`, waits up to `grace`, then SIGKILLs; returns the wait status.
  Result<int> stop(int sig, std::chrono::milliseconds grace) noexcept;

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int wait_status_ = 0;
};

// Forks a child that runs `body` and exits with its return value (never returns to the
// caller's stack in the child).
Result<ChildProcess> fork_child(const std::function<int()>& body) noexcept;

// Starts `argv[0]` (looked up on PATH) with stdout and stderr appended to `log_path`.
Result<ChildProcess> spawn_program(const std::vector<std::string>& argv, const std::string& log_path) noexcept;

// The absolute path of `program` on PATH, or "" if it is not installed.
std::string find_on_path(const std::string& program);

// A human-readable description of a wait status ("exit 0", "signal 9").
std::string describe_wait_status(int wait_status);

// "what: strerror(errno)" for OS failures, "what" otherwise.
std::string describe(const Status& status);

// The last `bytes` of a text file ("" if it cannot be read), for error messages.
std::string file_tail(const std::string& path, size_t bytes = 2000);

// Sends/receives one fixed-size message over a SOCK_SEQPACKET socket; receive waits at most
// `timeout` and fails if the peer closed its end (kUnavailable) or sent a message of another
// size (kProtocol).
Status send_message(int fd, const void* msg, size_t size) noexcept;
Status receive_message(int fd, void* msg, size_t size, std::chrono::milliseconds timeout) noexcept;

// CPU time (user + system, all threads) a process has used, in seconds, from /proc/<pid>/stat.
Result<double> process_cpu_seconds(pid_t pid) noexcept;

// The 1-minute load average (other work competing for the cores), if readable.
std::optional<double> load_average() noexcept;

// A private temporary directory, removed with everything in it on destruction.
class TempDir {
 public:
  static Result<TempDir> create(const char* prefix) noexcept;
  TempDir(TempDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  TempDir& operator=(TempDir&&) = delete;
  TempDir(const TempDir&) = delete;
  ~TempDir();
  const std::string& path() const noexcept { return path_; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace kdn::bench
