// Connections as kdnd accepts them, seen by clients written from docs/protocol.md: a client
// that sends its hello at once and then reads must read why it was refused (PERMISSION, BUSY),
// not a reset; and a burst of engines of one uid starting together all become sessions under
// the default caps. Runs the real kdnd binary; acting as another uid needs root.
#include "kdnd_process.h"
#include "raw_client.h"

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace kdn::testing {
namespace {

// kdnd stopped (SIGSTOP) for `ms`, then let go from a thread: connections made meanwhile have
// sent their hello before kdnd accepts them, as a client's often has.
class KdndPaused {
 public:
  KdndPaused(pid_t pid, int ms) : pid_(pid) {
    ::kill(pid_, SIGSTOP);
    resume_ = std::thread([this, ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      ::kill(pid_, SIGCONT);
    });
  }
  ~KdndPaused() { resume_.join(); }

 private:
  pid_t pid_;
  std::thread resume_;
};

// A client of plain system calls: connects and sends its hello at once (a send that fails is
// no reason to stop before reading, as docs/protocol.md says). Returns the socket, or -errno.
int connect_and_say_hello(const std::string& socket) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int e = errno;
    ::close(fd);
    return -e;
  }
  ipc::HelloRequest req;
  req.payload_bytes = 1 << 16;
  auto hello = ipc::make_hello(req);
  (void)::send(fd, &*hello, sizeof *hello, MSG_NOSIGNAL);
  return fd;
}

// Then reads (and closes): the status word of what came, as every welcome has it, or -errno
// of the read that failed.
int read_answer(int fd) {
  pollfd p{fd, POLLIN, 0};
  unsigned char buf[512];
  const ssize_t n = ::poll(&p, 1, 5000) == 1 ? ::recv(fd, buf, sizeof buf, 0) : -1;
  const int e = errno;
  ::close(fd);
  if (n < 0) return -e;
  if (n < 8) return -10000 - int(n);
  int32_t status;
  std::memcpy(&status, buf + 4, sizeof status);
  return status;
}

// `n` clients say hello while kdnd is stopped, then read; returns how many read `expected`.
int refusals_read(const KdndProcess& d, int n, int expected) {
  std::vector<int> fds;
  {
    KdndPaused paused(d.pid(), 300);
    for (int i = 0; i < n; ++i) fds.push_back(connect_and_say_hello(d.socket()));
  }
  int read = 0;
  for (int fd : fds) {
    const int said = fd >= 0 ? read_answer(fd) : fd;
    if (said != expected) std::fprintf(stderr, "read %d, not %d\n", said, expected);
    read += said == expected;
  }
  return read;
}

TEST(Accept, AClientThatSendsItsHelloFirstReadsThePermissionRefusal) {
  if (::getuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "acting as another uid needs root");
  KdndProcess d;
  ::chmod(d.dir().c_str(), 0755);
  ::chmod(d.socket().c_str(), 0777);
  // uid 4199 is admitted nowhere: cut off at accept, before kdnd reads its hello. (The child
  // cannot signal kdnd: the pause is the parent's, around the child's connections.)
  int done[2];
  ASSERT_EQ(::pipe(done), 0);
  std::vector<int> fds;
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(4199) != 0 || ::setuid(4199) != 0) _exit(99);
    char go;
    if (::read(done[0], &go, 1) != 1) _exit(98);
    for (int i = 0; i < 10; ++i) fds.push_back(connect_and_say_hello(d.socket()));
    if (::read(done[0], &go, 1) != 1) _exit(98);  // kdnd runs again
    int read = 0;
    for (int fd : fds) {
      const int said = fd >= 0 ? read_answer(fd) : fd;
      if (said != KDN_ERR_PERMISSION) std::fprintf(stderr, "read %d\n", said);
      read += said == KDN_ERR_PERMISSION;
    }
    _exit(read == 10 ? 0 : 1);
  }
  ::kill(d.pid(), SIGSTOP);
  (void)!::write(done[1], "g", 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(d.pid(), SIGCONT);
  (void)!::write(done[1], "g", 1);
  int st = 0;
  ::waitpid(child, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  ::close(done[0]);
  ::close(done[1]);
}

TEST(Accept, AClientThatSendsItsHelloFirstReadsTheBusyRefusal) {
  KdndProcess d({"--set", "max_pending_handshakes_per_uid=1", "--set", "handshake_timeout_ms=30000"});
  auto silent = ipc::uds_connect(d.socket(), 2000);  // holds this uid's one pending slot
  ASSERT_TRUE(silent.ok());
  EXPECT_EQ(refusals_read(d, 10, KDN_ERR_BUSY), 10);
}

TEST(Accept, FiftyEnginesOfOneUidStartingTogetherAllBecomeSessions) {
  KdndProcess d;  // the default caps
  constexpr int kEngines = 50;
  // All connect before any says hello: kdnd holds the 50 as pending handshakes at once.
  std::vector<ipc::UniqueFd> socks;
  for (int i = 0; i < kEngines; ++i) {
    auto fd = ipc::uds_connect(d.socket(), 2000);
    ASSERT_TRUE(fd.ok()) << i;
    socks.push_back(std::move(*fd));
  }
  int sessions = 0;
  std::string refusals;
  for (auto& sock : socks) {
    ipc::HelloRequest req;
    req.payload_bytes = 1 << 16;
    auto hello = ipc::make_hello(req);
    auto hs = ipc::client_handshake(sock.get(), *hello, 5000);
    if (!hs.ok()) {
      refusals += std::string(hs.status().what()) + "; ";
      continue;
    }
    auto cs = ipc::ClientSession::attach(std::move(*hs));
    sessions += cs.ok();
  }
  EXPECT_EQ(sessions, kEngines) << refusals;
}

}  // namespace
}  // namespace kdn::testing
