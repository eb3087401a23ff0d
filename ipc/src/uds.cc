#include <kdn/ipc/uds.h>

#include <kdn/common/clock.h>
#include <kdn/common/files.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace kdn::ipc {
namespace {

constexpr uint32_t kStaleProbeMs = 200;

struct SocketAddress {
  sockaddr_un addr{};
  socklen_t len = 0;
};

Result<SocketAddress> make_address(const std::string& path) noexcept {
  SocketAddress a;
  if (path.empty() || path.size() >= sizeof(a.addr.sun_path) || path.find('\0') != std::string::npos) {
    return Status(Code::kInvalidArgument, "socket path empty or too long for sockaddr_un");
  }
  a.addr.sun_family = AF_UNIX;
  std::memcpy(a.addr.sun_path, path.data(), path.size());
  a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return a;
}

Result<UniqueFd> new_socket(bool nonblocking) noexcept {
  int type = SOCK_SEQPACKET | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0);
  UniqueFd fd(::socket(AF_UNIX, type, 0));
  if (!fd) return Status::from_errno("socket", errno);
  return fd;
}

// A failure with its sentence: `what` for the Status, `*error` naming the path and errno.
Status fail(std::string* error, Status st, const std::string& sentence) {
  if (error) {
    try {
      *error = sentence;
      if (st.sys_errno()) *error += std::string(": ") + std::strerror(st.sys_errno());
    } catch (...) {  // out of memory for the message: the Status alone still says what
    }
  }
  return st;
}

// The socket's directory: created if missing, and then trusted only if it is a real
// directory of ours (or root's) that no one else can write.
Status check_socket_dir(const std::string& dir, mode_t mode, std::string* error) {
  if (::mkdir(dir.c_str(), mode) == 0) {
    (void)::chmod(dir.c_str(), mode);  // mkdir applied the umask
  } else if (errno != EEXIST) {
    return fail(error, Status::from_errno("mkdir socket directory", errno), "mkdir " + dir);
  }
  return check_private_dir(dir, "socket directory", error);
}

// Creates the missing directories of `path`'s parent with `mode` and checks the parent.
Status make_parent_dirs(const std::string& path, mode_t mode, std::string* error) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return check_socket_dir(".", mode, error);
  if (slash == 0) return check_socket_dir("/", mode, error);
  std::string parent = path.substr(0, slash);
  for (size_t i = parent.find('/', 1); i != std::string::npos; i = parent.find('/', i + 1)) {
    std::string prefix = parent.substr(0, i);
    if (::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST)
      return fail(error, Status::from_errno("mkdir", errno), "mkdir " + prefix);
  }
  return check_socket_dir(parent, mode, error);
}

// An existing socket file: remove it if it is stale (nobody accepts on it).
Status remove_if_stale(const std::string& path, std::string* error) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return OkStatus();  // gone meanwhile
  if (!S_ISSOCK(st.st_mode))
    return fail(error, Status(Code::kInvalidArgument, "socket path exists and is not a socket"),
                path + " exists and is not a socket; kdnd replaces only a stale socket");
  Result<UniqueFd> probe = uds_connect(path, kStaleProbeMs);
  if (probe.ok())
    return fail(error, Status(Code::kBusy, "another kdnd is listening on the socket"),
                "another kdnd is listening on " + path);
  if (probe.status().code() != Code::kUnavailable)
    return fail(error, probe.status(), "probing the existing socket " + path);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    return fail(error, Status::from_errno("unlink stale socket", errno), "removing the stale socket " + path);
  return OkStatus();
}

Status set_blocking(int fd) noexcept {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) return Status::from_errno("fcntl", errno);
  return OkStatus();
}

void sleep_briefly() noexcept {
  timespec ts{0, 1'000'000};
  ::nanosleep(&ts, nullptr);
}

// Waits for readability until deadline; OK when readable or hung up. Polls at least once,
// so a zero timeout still reports a message that is already there.
Status wait_readable(int sock, uint64_t deadline_ns) noexcept {
  for (;;) {
    uint64_t now = now_ns();
    uint64_t left_ms = now >= deadline_ns ? 0 : (deadline_ns - now + 999'999) / 1'000'000;
    pollfd p{sock, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left_ms > 60'000 ? 60'000 : left_ms));
    if (rc > 0) return OkStatus();
    if (rc < 0 && errno != EINTR) return Status::from_errno("poll", errno);
    if (rc == 0 && now_ns() >= deadline_ns) return Status(Code::kTimeout, "no message in time");
  }
}

// Takes ownership of every fd in the control data. False if a non-SCM_RIGHTS message came.
bool adopt_fds(msghdr& msg, ReceivedMessage& out, size_t& total) noexcept {
  bool only_rights = true;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      only_rights = false;
      continue;
    }
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(c);
    for (size_t i = 0; i < n; ++i, ++total) {
      int fd;
      std::memcpy(&fd, data + i * sizeof(int), sizeof(int));
      if (out.num_fds < kMaxMessageFds) {
        out.fds[out.num_fds++].reset(fd);
      } else {
        ::close(fd);
      }
    }
  }
  return only_rights;
}

Result<size_t> recv_once(int sock, std::span<std::byte> buffer, ReceivedMessage& out, size_t& total_fds,
                         bool& only_rights) noexcept {
  alignas(cmsghdr) unsigned char control[CMSG_SPACE(sizeof(int) * kMaxMessageFds)];
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) return Status::from_errno("recvmsg", errno);
  only_rights = adopt_fds(msg, out, total_fds);
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    return Status(Code::kProtocol, "message or its descriptors were truncated");
  }
  return static_cast<size_t>(n);
}

}  // namespace

std::string default_socket_path() {
  const char* explicit_path = std::getenv("KDN_SOCKET");
  if (explicit_path != nullptr && explicit_path[0] != '\0') return explicit_path;
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && runtime[0] != '\0') return std::string(runtime) + "/kdn/kdnd.sock";
  return "/tmp/kdn-" + std::to_string(::getuid()) + "/kdnd.sock";
}

Result<UniqueFd> uds_listen(const std::string& path, const ListenOptions& options, std::string* error) {
  Result<SocketAddress> addr = make_address(path);
  if (!addr.ok()) return fail(error, addr.status(), "socket path '" + path + "' is empty or longer than 107 bytes");
  KDN_RETURN_IF_ERROR(make_parent_dirs(path, options.dir_mode, error));
  Result<UniqueFd> fd = new_socket(true);
  if (!fd.ok()) return fail(error, fd.status(), "socket for " + path);
  const sockaddr* sa = reinterpret_cast<const sockaddr*>(&addr->addr);
  if (::bind(fd->get(), sa, addr->len) != 0) {
    if (errno != EADDRINUSE) return fail(error, Status::from_errno("bind", errno), "bind " + path);
    KDN_RETURN_IF_ERROR(remove_if_stale(path, error));
    if (::bind(fd->get(), sa, addr->len) != 0) return fail(error, Status::from_errno("bind", errno), "bind " + path);
  }
  // The file is ours alone until this chmod: the directory is checked and nobody else writes it.
  if (::chmod(path.c_str(), options.socket_mode) != 0)
    return fail(error, Status::from_errno("chmod socket", errno), "chmod " + path);
  if (::listen(fd->get(), options.backlog) != 0)
    return fail(error, Status::from_errno("listen", errno), "listen on " + path);
  return std::move(*fd);
}

Result<UniqueFd> uds_accept(int listen_fd) noexcept {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return UniqueFd(fd);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) return UniqueFd();
    return Status::from_errno("accept", errno);
  }
}

Result<UniqueFd> uds_connect(const std::string& path, uint32_t timeout_ms) noexcept {
  Result<SocketAddress> addr = make_address(path);
  if (!addr.ok()) return addr.status();
  Result<UniqueFd> fd = new_socket(true);
  if (!fd.ok()) return fd.status();
  uint64_t deadline = now_ns() + uint64_t{timeout_ms} * 1'000'000;
  const sockaddr* sa = reinterpret_cast<const sockaddr*>(&addr->addr);
  for (;;) {
    if (::connect(fd->get(), sa, addr->len) == 0) break;
    int err = errno;
    if (err == ENOENT || err == ECONNREFUSED || err == ENOTDIR) {
      return Status(Code::kUnavailable, "no kdnd listens on the socket");
    }
    if (err != EAGAIN && err != EINTR) return Status::from_errno("connect", err);
    // EAGAIN on a Unix socket: the listener's backlog is full. Retry until the deadline.
    if (now_ns() >= deadline) return Status(Code::kTimeout, "kdnd did not accept in time");
    sleep_briefly();
  }
  KDN_RETURN_IF_ERROR(set_blocking(fd->get()));
  return std::move(*fd);
}

Status send_message(int sock, std::span<const std::byte> bytes, std::span<const int> fds) noexcept {
  if (fds.size() > kMaxMessageFds) return Status(Code::kInvalidArgument, "too many fds for one message");
  alignas(cmsghdr) unsigned char control[CMSG_SPACE(sizeof(int) * kMaxMessageFds)] = {};
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  // MSG_DONTWAIT: the daemon never blocks on a client that does not read; MSG_NOSIGNAL: a
  // vanished peer is an error value, not SIGPIPE.
  ssize_t n = ::sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return Status(Code::kUnavailable, "peer closed");
  if (n < 0 && errno == EAGAIN) return Status(Code::kBusy, "peer is not reading its socket");
  if (n < 0) return Status::from_errno("sendmsg", errno);
  if (static_cast<size_t>(n) != bytes.size()) return Status(Code::kIo, "short send on a seqpacket socket");
  return OkStatus();
}

Result<ReceivedMessage> recv_message(int sock, std::span<std::byte> buffer, size_t max_fds,
                                     uint32_t timeout_ms) noexcept {
  uint64_t deadline = now_ns() + uint64_t{timeout_ms} * 1'000'000;
  for (;;) {
    KDN_RETURN_IF_ERROR(wait_readable(sock, deadline));
    ReceivedMessage out;
    size_t total_fds = 0;
    bool only_rights = true;
    Result<size_t> n = recv_once(sock, buffer, out, total_fds, only_rights);
    if (!n.ok() && n.status().sys_errno() == EAGAIN) continue;  // woken for nothing
    if (!n.ok() && n.status().sys_errno() == ECONNRESET) return Status(Code::kUnavailable, "peer reset");
    if (!n.ok()) return n.status();
    if (!only_rights) return Status(Code::kProtocol, "unexpected control message");
    if (total_fds > max_fds) return Status(Code::kProtocol, "more descriptors than expected");
    if (*n == 0 && total_fds == 0) return Status(Code::kUnavailable, "peer closed the connection");
    out.bytes = *n;
    return out;
  }
}

Result<PeerCredentials> peer_credentials(int sock) noexcept {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::from_errno("SO_PEERCRED", errno);
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

Result<std::vector<gid_t>> peer_groups(int sock) noexcept {
  gid_t groups[256];
  socklen_t len = sizeof(groups);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups, &len) != 0) {
    return Status::from_errno("SO_PEERGROUPS", errno);
  }
  try {
    return std::vector<gid_t>(groups, groups + len / sizeof(gid_t));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "peer groups");
  }
}

}  // namespace kdn::ipc
