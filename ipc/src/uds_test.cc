#include <kdn/ipc/segment.h>
#include <kdn/ipc/uds.h>

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "testing/fork_child.h"

namespace kdn::ipc {
namespace {

using testing::fork_child;
using testing::wait_child;

int open_fd_count() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n - 1;  // the DIR's own descriptor
}

class UdsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdn-uds-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/sub/kdnd.sock";
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::rmdir((dir_ + "/sub").c_str());
    ::rmdir(dir_.c_str());
  }
  std::string dir_, path_;
};

std::span<const std::byte> bytes_of(const char* s) { return std::as_bytes(std::span(s, std::strlen(s))); }

// A connected SEQPACKET pair without a listener, for message-level tests.
std::pair<UniqueFd, UniqueFd> socket_pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return {};
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

TEST(DefaultSocketPath, FollowsTheEnvironment) {
  ::setenv("KDN_SOCKET", "/run/custom.sock", 1);
  EXPECT_EQ(default_socket_path(), "/run/custom.sock");
  ::unsetenv("KDN_SOCKET");
  ::setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
  EXPECT_EQ(default_socket_path(), "/run/user/1000/kdn/kdnd.sock");
  ::unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(default_socket_path(), "/tmp/kdn-" + std::to_string(::getuid()) + "/kdnd.sock");
}

TEST_F(UdsTest, ListenCreatesAPrivateDirectoryAndAcceptsConnections) {
  auto listener = uds_listen(path_);
  ASSERT_TRUE(listener.ok()) << listener.status().what();
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/sub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto none = uds_accept(listener->get());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->valid()) << "non-blocking listener: nothing pending";
  auto client = uds_connect(path_, 1000);
  ASSERT_TRUE(client.ok()) << client.status().what();
  auto server = uds_accept(listener->get());
  ASSERT_TRUE(server.ok() && server->valid());
  ASSERT_TRUE(send_message(client->get(), bytes_of("hello"), {}).ok());
  std::byte buf[64];
  auto msg = recv_message(server->get(), buf, 0, 1000);
  ASSERT_TRUE(msg.ok()) << msg.status().what();
  EXPECT_EQ(msg->bytes, 5u);
  EXPECT_EQ(std::memcmp(buf, "hello", 5), 0);
  auto cred = peer_credentials(server->get());
  ASSERT_TRUE(cred.ok());
  EXPECT_EQ(cred->pid, ::getpid());
  EXPECT_EQ(cred->uid, ::getuid());
}

TEST_F(UdsTest, StaleSocketIsReplacedLiveOneIsNot) {
  {
    auto first = uds_listen(path_);
    ASSERT_TRUE(first.ok());
    auto second = uds_listen(path_);
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), Code::kBusy) << "a live daemon keeps its socket";
  }  // the first listener dies; its socket file stays behind
  struct stat st;
  ASSERT_EQ(::lstat(path_.c_str(), &st), 0);
  auto again = uds_listen(path_);
  EXPECT_TRUE(again.ok()) << again.status().what();
}

TEST_F(UdsTest, ListenRefusesToReplaceANonSocket) {
  ASSERT_EQ(::mkdir((dir_ + "/sub").c_str(), 0700), 0);
  int fd = ::open(path_.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  auto l = uds_listen(path_);
  EXPECT_EQ(l.status().code(), Code::kInvalidArgument);
}

TEST_F(UdsTest, ListenRefusesADirectoryOthersCanWrite) {
  const std::string sub = dir_ + "/sub";
  ASSERT_EQ(::mkdir(sub.c_str(), 0700), 0);
  struct Case {
    mode_t mode;
    const char* says;
  } cases[] = {{0777, "is writable by every user (mode 0777)"},
               {01777, "is writable by every user (mode 1777)"},  // sticky, like /tmp
               {0770, "is writable by its group (mode 0770)"}};
  for (const Case& c : cases) {
    ASSERT_EQ(::chmod(sub.c_str(), c.mode), 0);
    std::string error;
    auto l = uds_listen(path_, {}, &error);
    EXPECT_EQ(l.status().code(), Code::kPermission) << std::oct << c.mode;
    EXPECT_NE(error.find("socket directory " + sub + " " + c.says), std::string::npos) << error;
    struct stat st;
    EXPECT_NE(::lstat(path_.c_str(), &st), 0) << "no socket was created";
  }
  ASSERT_EQ(::chmod(sub.c_str(), 0755), 0);  // others may enter and connect, not write
  EXPECT_TRUE(uds_listen(path_).ok());
}

TEST_F(UdsTest, ListenRefusesASymlinkedDirectory) {
  const std::string real = dir_ + "/real";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(real.c_str(), (dir_ + "/sub").c_str()), 0);
  std::string error;
  auto l = uds_listen(path_, {}, &error);
  EXPECT_EQ(l.status().code(), Code::kPermission);
  EXPECT_NE(error.find(dir_ + "/sub is a symlink"), std::string::npos) << error;
  ::unlink((dir_ + "/sub").c_str());
  ::rmdir(real.c_str());
}

TEST_F(UdsTest, ListenAppliesTheModesItIsGiven) {
  ListenOptions o;
  o.dir_mode = 0711;
  o.socket_mode = 0666;
  const mode_t old_mask = ::umask(077);  // the modes hold whatever the umask
  auto l = uds_listen(path_, o);
  ::umask(old_mask);
  ASSERT_TRUE(l.ok()) << l.status().what();
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/sub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0711u);
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0666u);
}

TEST_F(UdsTest, ListenErrorsNameThePath) {
  std::string error;
  auto live = uds_listen(path_);
  ASSERT_TRUE(live.ok());
  EXPECT_FALSE(uds_listen(path_, {}, &error).ok());
  EXPECT_EQ(error, "another kdnd is listening on " + path_);
  live = Status(Code::kUnavailable, "closed");
  ::unlink(path_.c_str());
  ASSERT_EQ(::mkdir(path_.c_str(), 0700), 0);
  EXPECT_FALSE(uds_listen(path_, {}, &error).ok());
  EXPECT_EQ(error, path_ + " exists and is not a socket; kdnd replaces only a stale socket");
  ::rmdir(path_.c_str());
  const std::string long_path = dir_ + "/" + std::string(120, 'x');
  EXPECT_FALSE(uds_listen(long_path, {}, &error).ok());
  EXPECT_EQ(error, "socket path '" + long_path + "' is empty or longer than 107 bytes");
}

TEST_F(UdsTest, ConnectWithoutDaemonIsUnavailable) {
  auto c = uds_connect(path_, 100);
  EXPECT_EQ(c.status().code(), Code::kUnavailable);
  EXPECT_EQ(uds_connect(std::string(200, 'x'), 100).status().code(), Code::kInvalidArgument);
}

TEST(UdsMessage, TruncatedMessageIsAProtocolError) {
  auto [a, b] = socket_pair();
  ASSERT_TRUE(send_message(a.get(), bytes_of("0123456789"), {}).ok());
  std::byte small[4];
  auto msg = recv_message(b.get(), small, 0, 1000);
  EXPECT_EQ(msg.status().code(), Code::kProtocol);
}

TEST(UdsMessage, UnexpectedDescriptorsAreClosedAndRefused) {
  auto [a, b] = socket_pair();
  auto seg = SharedSegment::create("uds-test", 4096);
  ASSERT_TRUE(seg.ok());
  int before = open_fd_count();
  int fds[3] = {seg->fd(), seg->fd(), seg->fd()};
  ASSERT_TRUE(send_message(a.get(), bytes_of("x"), fds).ok());
  std::byte buf[16];
  auto msg = recv_message(b.get(), buf, 1, 1000);
  EXPECT_EQ(msg.status().code(), Code::kProtocol);
  EXPECT_EQ(open_fd_count(), before) << "every received fd must be closed";
}

TEST(UdsMessage, MoreDescriptorsThanTheControlBufferAreRefused) {
  auto [a, b] = socket_pair();
  auto seg = SharedSegment::create("uds-test", 4096);
  ASSERT_TRUE(seg.ok());
  int before = open_fd_count();
  // Bypass send_message's limit with a raw sendmsg of kMaxMessageFds + 4 descriptors.
  constexpr size_t kN = kMaxMessageFds + 4;
  int fds[kN];
  for (int& f : fds) f = seg->fd();
  alignas(cmsghdr) unsigned char control[CMSG_SPACE(sizeof(fds))] = {};
  char byte = 'x';
  iovec iov{&byte, 1};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(fds));
  std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
  ASSERT_EQ(::sendmsg(a.get(), &m, 0), 1);
  std::byte buf[16];
  auto msg = recv_message(b.get(), buf, kMaxMessageFds, 1000);
  EXPECT_EQ(msg.status().code(), Code::kProtocol);
  EXPECT_EQ(open_fd_count(), before);
}

TEST(UdsMessage, PeerCloseAndTimeout) {
  auto [a, b] = socket_pair();
  std::byte buf[16];
  EXPECT_EQ(recv_message(b.get(), buf, 0, 20).status().code(), Code::kTimeout);
  a.reset();
  EXPECT_EQ(recv_message(b.get(), buf, 0, 1000).status().code(), Code::kUnavailable);
  EXPECT_EQ(send_message(b.get(), bytes_of("x"), {}).code(), Code::kUnavailable);
}

// The real use: a daemon process hands memfds to a client process, both map them.
TEST_F(UdsTest, MemfdsPassBetweenProcesses) {
  auto listener = uds_listen(path_);
  ASSERT_TRUE(listener.ok());
  pid_t child = fork_child([&]() -> int {
    auto sock = uds_connect(path_, 5000);
    if (!sock.ok()) return 1;
    std::byte buf[64];
    auto msg = recv_message(sock->get(), buf, 2, 5000);
    if (!msg.ok() || msg->num_fds != 2 || msg->bytes != 8) return 2;
    uint64_t size;
    std::memcpy(&size, buf, sizeof(size));
    auto a = SharedSegment::attach(std::move(msg->fds[0]), size);
    auto b = SharedSegment::attach(std::move(msg->fds[1]), size);
    if (!a.ok() || !b.ok()) return 3;
    if (std::strcmp(reinterpret_cast<char*>(a->data()), "from daemon") != 0) return 4;
    std::strcpy(reinterpret_cast<char*>(b->data()), "from client");
    return send_message(sock->get(), bytes_of("done"), {}).ok() ? 0 : 5;
  });
  ASSERT_GT(child, 0);
  auto a = SharedSegment::create("uds-a", 1 << 16);
  auto b = SharedSegment::create("uds-b", 1 << 16);
  ASSERT_TRUE(a.ok() && b.ok());
  std::strcpy(reinterpret_cast<char*>(a->data()), "from daemon");
  UniqueFd conn;
  for (int i = 0; i < 5000 && !conn.valid(); ++i) {
    auto c = uds_accept(listener->get());
    ASSERT_TRUE(c.ok());
    conn = std::move(*c);
    if (!conn.valid()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(conn.valid());
  uint64_t size = a->size();
  int fds[2] = {a->fd(), b->fd()};
  ASSERT_TRUE(send_message(conn.get(), std::as_bytes(std::span(&size, 1)), fds).ok());
  std::byte buf[16];
  auto reply = recv_message(conn.get(), buf, 0, 10'000);
  EXPECT_TRUE(reply.ok()) << reply.status().what();
  EXPECT_EQ(wait_child(child, 10'000), 0);
  EXPECT_STREQ(reinterpret_cast<char*>(b->data()), "from client");
}

}  // namespace
}  // namespace kdn::ipc
