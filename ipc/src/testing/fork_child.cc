#include "testing/fork_child.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <ctime>

#include <kdn/common/clock.h>

namespace kdn::ipc::testing {

pid_t fork_child(const std::function<int()>& fn) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = fn();
    std::fflush(nullptr);  // _exit skips stdio's flush; keep the child's report lines
    ::_exit(rc);
  }
  return pid;
}

int wait_child(pid_t pid, uint32_t timeout_ms) {
  uint64_t deadline = now_ns() + uint64_t{timeout_ms} * 1'000'000;
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid && WIFEXITED(status)) return WEXITSTATUS(status);
    if (r == pid && WIFSIGNALED(status)) return -WTERMSIG(status);
    if (r < 0 && errno != EINTR) return kChildTimedOut;
    if (now_ns() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return kChildTimedOut;
    }
    timespec ts{0, 1'000'000};
    ::nanosleep(&ts, nullptr);
  }
}

}  // namespace kdn::ipc::testing
