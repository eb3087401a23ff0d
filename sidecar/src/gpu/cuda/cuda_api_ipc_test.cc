// kdnd opening an engine's memory across processes: this binary re-executes itself as the
// engine (GpuApiChild.ServeAsEngine, which skips unless KDN_GPU_API_CHILD names its socket).
//
//   engine (child)                                  kdnd (parent)
//   cudaMalloc A, VMM B, fill; ipc event E
//   Offer{A handle, E handle, sizes} + fd of B ──▶  open A, import B, open E; check A and B;
//                                                   write new patterns, record E, no sync
//   wait on E, check A and B               ◀──────  Written
//   Verdict ──────────────────────────────────────▶ sync, close A, unmap B, destroy E
//   free A, B, E; exit 0                   ◀──────  Closed
//
// Every wait is a poll with a timeout; the parent kills the child if it outlives the test.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_api.h"
#include "cuda_api_testing.h"

extern char** environ;

namespace kdn::sidecar::gpu {
namespace {

constexpr int kWaitMs = 30000;
constexpr const char* kChildEnv = "KDN_GPU_API_CHILD";
constexpr uint64_t kLegacyBytes = 32ull << 20;
constexpr uint64_t kVmmBytes = 32ull << 20;  // the child rounds up to its granularity
constexpr uint32_t kSeedA = 0xa1, kSeedB = 0xb2, kSeedC = 0xc3, kSeedD = 0xd4;

enum class Kind : uint32_t { kOffer = 1, kWritten, kVerdict, kClosed };

struct Message {
  Kind kind = Kind::kOffer;
  int32_t ok = 1;
  uint64_t legacy_bytes = 0, vmm_bytes = 0;
  IpcHandle memory, event;
  char why[160] = {};
};

uint32_t pattern(uint32_t seed, size_t i) { return static_cast<uint32_t>(i * 2246822519u) ^ (seed * 0x01010101u); }

std::vector<uint32_t> make(uint64_t bytes, uint32_t seed) {
  std::vector<uint32_t> v(bytes / 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] = pattern(seed, i);
  return v;
}

// Copies `bytes` of device memory out on `stream` (after what is queued there) and compares.
::testing::AssertionResult holds(void* dev, uint64_t bytes, uint32_t seed, void* stream) {
  std::vector<uint32_t> got(bytes / 4, 0);
  Status st = copy_async(got.data(), dev, bytes, stream);
  if (st.ok()) st = stream_sync(stream);
  if (!st.ok()) return ::testing::AssertionFailure() << "copy out: " << st.what();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != pattern(seed, i)) return ::testing::AssertionFailure() << "word " << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

Status write_pattern(void* dev, const std::vector<uint32_t>& host, void* stream) {
  return copy_async(dev, host.data(), host.size() * 4, stream);
}

bool send_message(int sock, const Message& m, int fd = -1) {
  iovec iov{const_cast<Message*>(&m), sizeof m};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  if (fd >= 0) {
    h.msg_control = control;
    h.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  return ::sendmsg(sock, &h, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof m);
}

// One message of `want` kind within kWaitMs; a passed fd lands in *fd.
::testing::AssertionResult receive(int sock, Kind want, Message* m, int* fd = nullptr) {
  pollfd p{sock, POLLIN, 0};
  if (::poll(&p, 1, kWaitMs) != 1) return ::testing::AssertionFailure() << "no message within " << kWaitMs << " ms";
  iovec iov{m, sizeof *m};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  h.msg_control = control;
  h.msg_controllen = sizeof control;
  if (::recvmsg(sock, &h, MSG_CMSG_CLOEXEC) != static_cast<ssize_t>(sizeof *m)) {
    return ::testing::AssertionFailure() << "short or failed receive (peer gone?)";
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && fd != nullptr) {
      std::memcpy(fd, CMSG_DATA(c), sizeof *fd);
    }
  }
  if (m->kind != want) return ::testing::AssertionFailure() << "unexpected message kind";
  if (!m->ok) return ::testing::AssertionFailure() << "peer failed: " << m->why;
  return ::testing::AssertionSuccess();
}

// The child process; killed and reaped on scope exit if it is still running.
class Child {
 public:
  Child() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return;
    sock_ = sv[0];
    ::fcntl(sv[1], F_SETFD, 0);  // the child's end crosses exec
    char exe[4096] = {};
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    const std::string filter = "--gtest_filter=GpuApiChild.ServeAsEngine";
    const std::string env = std::string(kChildEnv) + "=" + std::to_string(sv[1]);
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    envp.push_back(const_cast<char*>(env.c_str()));
    envp.push_back(nullptr);
    char* argv[] = {exe, const_cast<char*>(filter.c_str()), nullptr};
    if (n > 0 && ::posix_spawn(&pid_, exe, nullptr, nullptr, argv, envp.data()) != 0) pid_ = -1;
    ::close(sv[1]);
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (sock_ >= 0) ::close(sock_);
  }
  bool started() const { return sock_ >= 0 && pid_ > 0; }
  int sock() const { return sock_; }
  // The child's exit status within kWaitMs, or -1.
  int wait_exit() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  int sock_ = -1;
  pid_t pid_ = -1;
};

TEST(GpuApiIpc, KdndOpensAnEnginesLegacyAndVmmMemoryAndRecordsItsEvent) {
  if (!available()) GTEST_SKIP() << "no CUDA device";
  const auto all = devices();
  ASSERT_FALSE(all.empty());
  if (!all[0].vmm_supported || !all[0].posix_fd_handles) GTEST_SKIP() << "device 0 lacks VMM with POSIX fds";
  Child child;
  ASSERT_TRUE(child.started());
  Message offer;
  int vmm_fd = -1;
  ASSERT_TRUE(receive(child.sock(), Kind::kOffer, &offer, &vmm_fd));
  ASSERT_GE(vmm_fd, 0) << "no fd came with the offer";
  ASSERT_EQ(offer.legacy_bytes, kLegacyBytes);

  auto legacy = open_ipc_memory(0, offer.memory);
  auto vmm = import_vmm_memory(0, vmm_fd, offer.vmm_bytes);
  ::close(vmm_fd);
  auto event = ipc_event_open(0, offer.event);
  ASSERT_TRUE(legacy.ok()) << legacy.status().what();
  ASSERT_TRUE(vmm.ok()) << vmm.status().what();
  ASSERT_TRUE(event.ok()) << event.status().what();
  auto stream = stream_create(0, true);
  ASSERT_TRUE(stream.ok()) << stream.status().what();

  EXPECT_TRUE(holds(*legacy, offer.legacy_bytes, kSeedA, *stream));
  EXPECT_TRUE(holds(*vmm, offer.vmm_bytes, kSeedB, *stream));
  const auto c = make(offer.legacy_bytes, kSeedC), d = make(offer.vmm_bytes, kSeedD);
  ASSERT_TRUE(write_pattern(*legacy, c, *stream).ok());
  ASSERT_TRUE(write_pattern(*vmm, d, *stream).ok());
  ASSERT_TRUE(event_record(*event, *stream).ok());  // the child orders its reads on this
  Message written;
  written.kind = Kind::kWritten;
  ASSERT_TRUE(send_message(child.sock(), written));
  Message verdict;
  EXPECT_TRUE(receive(child.sock(), Kind::kVerdict, &verdict));

  EXPECT_TRUE(stream_sync(*stream).ok());
  stream_destroy(*stream);
  event_destroy(*event);
  close_ipc_memory(0, *legacy);
  unmap_vmm_memory(*vmm, offer.vmm_bytes);
  Message closed;
  closed.kind = Kind::kClosed;
  ASSERT_TRUE(send_message(child.sock(), closed));
  EXPECT_EQ(child.wait_exit(), 0);
}

// ---- the engine side, run only as the child of the test above -------------------------------------

void fail_to_parent(int sock, const char* what) {
  Message m;
  m.kind = Kind::kOffer;
  m.ok = 0;
  std::snprintf(m.why, sizeof m.why, "%s", what);
  send_message(sock, m);
}

TEST(GpuApiChild, ServeAsEngine) {
  const char* env = std::getenv(kChildEnv);
  if (env == nullptr) GTEST_SKIP() << "runs only as GpuApiIpc's child";
  const int sock = std::atoi(env);
  ASSERT_TRUE(available());
  IpcHandle mem_handle, event_handle;
  auto legacy = testing::ipc_alloc(0, kLegacyBytes, &mem_handle);
  auto vmm = testing::vmm_alloc_export(0, kVmmBytes);
  auto event = ipc_event_create(0, &event_handle);
  auto stream = stream_create(0, false);
  for (const Status* st : {&legacy.status(), &vmm.status(), &event.status(), &stream.status()}) {
    if (!st->ok()) fail_to_parent(sock, st->what());
    ASSERT_TRUE(st->ok()) << st->what();
  }
  const auto a = make(kLegacyBytes, kSeedA), b = make(vmm->bytes, kSeedB);
  ASSERT_TRUE(write_pattern(*legacy, a, *stream).ok());
  ASSERT_TRUE(write_pattern(vmm->base, b, *stream).ok());
  ASSERT_TRUE(stream_sync(*stream).ok());

  Message offer;
  offer.kind = Kind::kOffer;
  offer.legacy_bytes = kLegacyBytes;
  offer.vmm_bytes = vmm->bytes;
  offer.memory = mem_handle;
  offer.event = event_handle;
  ASSERT_TRUE(send_message(sock, offer, vmm->fd));

  Message written;
  ASSERT_TRUE(receive(sock, Kind::kWritten, &written));
  ASSERT_TRUE(stream_wait_event(*stream, *event).ok());
  const auto ok_a = holds(*legacy, kLegacyBytes, kSeedC, *stream);
  const auto ok_b = holds(vmm->base, vmm->bytes, kSeedD, *stream);
  EXPECT_TRUE(ok_a);
  EXPECT_TRUE(ok_b);
  Message verdict;
  verdict.kind = Kind::kVerdict;
  verdict.ok = ok_a && ok_b;
  std::snprintf(verdict.why, sizeof verdict.why, "engine read back: legacy %s, vmm %s", ok_a ? "ok" : ok_a.message(),
                ok_b ? "ok" : ok_b.message());
  ASSERT_TRUE(send_message(sock, verdict));

  Message closed;
  EXPECT_TRUE(receive(sock, Kind::kClosed, &closed));
  stream_destroy(*stream);
  event_destroy(*event);
  testing::vmm_free(*vmm);
  testing::ipc_free(0, *legacy);
  ::close(sock);
}

}  // namespace
}  // namespace kdn::sidecar::gpu
