#include "process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace kdn::bench {
namespace {

constexpr int kChildSetupFailed = 127;

// In the child, right after fork: die with the parent. The getppid check closes the race
// where the parent died before prctl took effect.
void die_with_parent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(kChildSetupFailed);
}

int poll_timeout_ms(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

}  // namespace

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), reaped_(other.reaped_), wait_status_(other.wait_status_) {
  other.pid_ = -1;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !reaped_) (void)stop(SIGTERM, std::chrono::seconds(5));
    pid_ = other.pid_;
    reaped_ = other.reaped_;
    wait_status_ = other.wait_status_;
    other.pid_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) (void)stop(SIGTERM, std::chrono::seconds(5));
}

bool ChildProcess::running() noexcept {
  if (pid_ <= 0 || reaped_) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_ || (r < 0 && errno == ECHILD)) {
    reaped_ = true;
    wait_status_ = status;
    return false;
  }
  return true;
}

Result<int> ChildProcess::wait_for(std::chrono::milliseconds timeout) noexcept {
  if (pid_ <= 0) return Status(Code::kInvalidArgument, "no child process");
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status(Code::kTimeout, "child process did not exit in time");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return wait_status_;
}

Result<int> ChildProcess::stop(int sig, std::chrono::milliseconds grace) noexcept {
  if (pid_ <= 0) return Status(Code::kInvalidArgument, "no child process");
  if (running()) kill(pid_, sig);
  Result<int> waited = wait_for(grace);
  if (waited.ok()) return waited;
  kill(pid_, SIGKILL);
  return wait_for(std::chrono::seconds(10));
}

Result<ChildProcess> fork_child(const std::function<int()>& body) noexcept {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return Status::from_errno("fork", errno);
  if (pid > 0) return ChildProcess(pid);
  die_with_parent(parent);
  int code = kChildSetupFailed;
  try {
    code = body();
  } catch (...) {
    code = kChildSetupFailed;
  }
  _exit(code);
}

Result<ChildProcess> spawn_program(const std::vector<std::string>& argv, const std::string& log_path) noexcept {
  if (argv.empty()) return Status(Code::kInvalidArgument, "empty command line");
  // Everything the child needs is prepared before fork: after fork only async-signal-safe
  // calls are made.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd < 0) return Status::from_errno("open log file", errno);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(log_fd);
    return Status::from_errno("fork", err);
  }
  if (pid == 0) {
    die_with_parent(parent);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    execvp(args[0], args.data());
    _exit(kChildSetupFailed);
  }
  close(log_fd);
  return ChildProcess(pid);
}

std::string find_on_path(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return access(program.c_str(), X_OK) == 0 ? program : std::string();
  }
  const char* path = getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/" + program;
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return {};
}

std::string describe_wait_status(int wait_status) {
  if (WIFEXITED(wait_status)) return "exit " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return "signal " + std::to_string(WTERMSIG(wait_status));
  return "status " + std::to_string(wait_status);
}

std::string describe(const Status& status) {
  std::string text = status.what();
  if (status.sys_errno() != 0) text += std::string(": ") + std::strerror(status.sys_errno());
  return text;
}

std::string file_tail(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::stringstream text;
  text << in.rdbuf();
  std::string all = text.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

Status send_message(int fd, const void* msg, size_t size) noexcept {
  while (true) {
    ssize_t n = send(fd, msg, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::from_errno("send control message", errno);
    if (static_cast<size_t>(n) != size) return Status(Code::kIo, "short control message");
    return OkStatus();
  }
}

Status receive_message(int fd, void* msg, size_t size, std::chrono::milliseconds timeout) noexcept {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, poll_timeout_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Status::from_errno("poll control socket", errno);
    if (ready == 0) return Status(Code::kTimeout, "control peer did not answer in time");
    // MSG_TRUNC: the real length of the datagram, so a wrong-sized one is detected.
    ssize_t n = recv(fd, msg, size, MSG_TRUNC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::from_errno("receive control message", errno);
    if (n == 0) return Status(Code::kUnavailable, "control peer exited");
    if (static_cast<size_t>(n) != size) return Status(Code::kProtocol, "control message size");
    return OkStatus();
  }
}

Result<double> process_cpu_seconds(pid_t pid) noexcept {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return Status(Code::kNotFound, "no /proc/<pid>/stat");
  // The command name (field 2) is parenthesized and may hold spaces: fields after the
  // last ')' start at field 3, so utime (14) and stime (15) are the 12th and 13th there.
  size_t close_paren = line.rfind(')');
  if (close_paren == std::string::npos) return Status(Code::kProtocol, "unparsable stat line");
  std::istringstream fields(line.substr(close_paren + 1));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  if (!fields) return Status(Code::kProtocol, "short stat line");
  long ticks = sysconf(_SC_CLK_TCK);
  return static_cast<double>(utime + stime) / static_cast<double>(ticks > 0 ? ticks : 100);
}

std::optional<double> load_average() noexcept {
  double loads[1];
  if (getloadavg(loads, 1) != 1) return std::nullopt;
  return loads[0];
}

Result<TempDir> TempDir::create(const char* prefix) noexcept {
  const char* tmp = getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return Status::from_errno("mkdtemp", errno);
  return TempDir(std::move(templ));
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace kdn::bench
