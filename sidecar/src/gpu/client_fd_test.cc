// pidfd_getfd between real processes: kdnd's copy of an engine's VMM descriptor, and the reason
// it gives when the kernel refuses (the engine itself only sees KDN_ERR_PERMISSION).
#include "gpu/client_fd.h"

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>

namespace kdn::sidecar::gpu {
namespace {

// An engine stand-in: a child of `uid` holding one end of a pipe open until the test ends.
struct Engine {
  pid_t pid = -1;
  int fd = -1;  // its descriptor's number in the child
  int release[2] = {-1, -1};

  explicit Engine(uint32_t uid, bool dumpable = true) {
    int told[2];
    if (::pipe(told) != 0 || ::pipe(release) != 0) return;
    pid = ::fork();
    if (pid == 0) {
      if (::setgid(uid) != 0 || ::setuid(uid) != 0) _exit(99);
      // Changing uid made the child undumpable, which refuses every tracer but a capable one;
      // an engine started as its user is dumpable.
      if (dumpable && ::prctl(PR_SET_DUMPABLE, 1) != 0) _exit(97);
      int held[2];
      if (::pipe(held) != 0) _exit(98);
      (void)!::write(told[1], &held[0], sizeof held[0]);
      char c;
      (void)!::read(release[0], &c, 1);
      _exit(0);
    }
    if (::read(told[0], &fd, sizeof fd) != sizeof fd) fd = -1;
    ::close(told[0]);
    ::close(told[1]);
  }
  ~Engine() {
    if (pid > 0) {
      (void)!::write(release[1], "x", 1);
      ::waitpid(pid, nullptr, 0);
    }
    ::close(release[0]);
    ::close(release[1]);
  }
};

// Runs `take` in a child of `uid` (no capabilities once it is not root); returns its exit code.
int as_uid(uint32_t uid, const std::function<int()>& take) {
  const pid_t c = ::fork();
  if (c == 0) {
    if (::setgid(uid) != 0 || ::setuid(uid) != 0) _exit(99);
    _exit(take());
  }
  int st = 0;
  ::waitpid(c, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

TEST(ClientFd, AnotherUidsEngineIsRefusedWithTheCauseAndTheFix) {
  if (::getuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "acting as other uids needs root");
  Engine engine(4101);
  ASSERT_GE(engine.fd, 0);
  EXPECT_EQ(as_uid(4102,
                   [&] {
                     auto fd = take_client_fd(uint32_t(engine.pid), 4101, engine.fd);
                     if (fd.ok()) return 1;
                     if (fd.status().code() != Code::kPermission) return 2;
                     const std::string why = fd.status().what();
                     const bool named = why.find("another uid") != std::string::npos &&
                                        why.find("CAP_SYS_PTRACE") != std::string::npos &&
                                        why.find("Fix:") != std::string::npos;
                     if (!named) std::fprintf(stderr, "%s\n", why.c_str());
                     return named ? 0 : 3;
                   }),
            0)
      << "1: taken; 2: another code; 3: the message names no cause or fix";
}

TEST(ClientFd, TheEnginesOwnUidOrCapSysPtraceTakesIt) {
  if (::getuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "acting as other uids needs root");
  Engine engine(4101);
  ASSERT_GE(engine.fd, 0);
  auto ours = take_client_fd(uint32_t(engine.pid), 4101, engine.fd);  // root: CAP_SYS_PTRACE
  ASSERT_TRUE(ours.ok()) << ours.status().what();
  ::close(*ours);
  // The same uid, where no Yama ptrace_scope forbids it.
  const int same = as_uid(4101, [&] {
    auto fd = take_client_fd(uint32_t(engine.pid), 4101, engine.fd);
    if (fd.ok()) return 0;
    return fd.status().code() == Code::kPermission && std::strstr(fd.status().what(), "ptrace_scope") ? 10 : 1;
  });
  EXPECT_TRUE(same == 0 || same == 10) << same;  // 10: refused by Yama, and said so
  auto none = take_client_fd(uint32_t(engine.pid), 4101, 1000);
  EXPECT_EQ(none.status().code(), Code::kInvalidArgument) << "no such descriptor";
}

TEST(ClientFd, AnUndumpableEngineIsRefusedWithTheCause) {
  if (::getuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "acting as other uids needs root");
  Engine engine(4101, /*dumpable=*/false);
  ASSERT_GE(engine.fd, 0);
  EXPECT_EQ(as_uid(4101,
                   [&] {
                     auto fd = take_client_fd(uint32_t(engine.pid), 4101, engine.fd);
                     if (fd.ok()) return 1;
                     const char* why = fd.status().what();
                     return fd.status().code() == Code::kPermission &&
                                    (std::strstr(why, "undumpable") || std::strstr(why, "ptrace_scope"))
                                ? 0
                                : 2;
                   }),
            0);
}

}  // namespace
}  // namespace kdn::sidecar::gpu
