// Unix-domain SOCK_SEQPACKET helpers for the handshake: listen, accept, connect, one message
// with descriptors each way, and the peer's credentials.
//
// SEQPACKET keeps message boundaries, so a message arrives whole or is reported truncated
// (MSG_TRUNC), and a close by the peer is seen as end-of-file. Every received descriptor is
// owned by a UniqueFd at once and received with MSG_CMSG_CLOEXEC; descriptors beyond what the
// caller expects are closed, and any truncation (of bytes or of control data) is a
// KDN_ERR_PROTOCOL error. Sockets are created close-on-exec.
//
// Thread safety: the functions are thread-safe; a socket is used by one thread at a time.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/fd.h>

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kdn::ipc {

constexpr size_t kMaxMessageFds = 8;

// $KDN_SOCKET, else $XDG_RUNTIME_DIR/kdn/kdnd.sock, else /tmp/kdn-$UID/kdnd.sock.
std::string default_socket_path();

struct ListenOptions {
  int backlog = 64;
  mode_t dir_mode = 0700;     // of the parent directory, when uds_listen creates it
  mode_t socket_mode = 0600;  // of the socket file (connecting needs write permission on it)
};

// Binds and listens on `path` (non-blocking, close-on-exec). Creates the missing parent
// directories with options.dir_mode. The parent must be a real
// directory (not a symlink) owned by this uid or root and writable by nobody else — in a
// directory others can write, another user could replace the socket and capture clients'
// hellos (KDN_ERR_PERMISSION). An existing socket file is removed only if nothing answers a
// connect on it (a stale socket of a dead daemon); a live daemon -> KDN_ERR_BUSY. A path too
// long for sockaddr_un -> KDN_ERR_INVALID_ARGUMENT. On failure `error`, if not null, gets a
// sentence naming the path and the cause ("bind /run/kdn/kdnd.sock: Permission denied").
Result<UniqueFd> uds_listen(const std::string& path, const ListenOptions& options = {}, std::string* error = nullptr);

// Accepts one connection (close-on-exec, blocking). Returns an empty UniqueFd when none is
// pending on a non-blocking listener.
Result<UniqueFd> uds_accept(int listen_fd) noexcept;

// Connects within timeout_ms. KDN_ERR_UNAVAILABLE if no daemon listens there,
// KDN_ERR_TIMEOUT if it does not accept in time.
Result<UniqueFd> uds_connect(const std::string& path, uint32_t timeout_ms) noexcept;

// Sends one message of `bytes` with `fds` attached (SCM_RIGHTS; at most kMaxMessageFds).
// The caller keeps its fds. KDN_ERR_UNAVAILABLE if the peer has gone.
Status send_message(int sock, std::span<const std::byte> bytes, std::span<const int> fds) noexcept;

struct ReceivedMessage {
  size_t bytes = 0;                          // message length
  size_t num_fds = 0;                        // descriptors received
  std::array<UniqueFd, kMaxMessageFds> fds;  // [0, num_fds) are owned here
};

// Receives one message into `buffer`, waiting at most timeout_ms. Errors:
//   KDN_ERR_PROTOCOL     the message was larger than buffer (MSG_TRUNC), control data was
//                        truncated (MSG_CTRUNC), more than max_fds descriptors arrived, or a
//                        control message other than SCM_RIGHTS arrived (all fds closed)
//   KDN_ERR_UNAVAILABLE  the peer closed the connection
//   KDN_ERR_TIMEOUT      nothing arrived in time
Result<ReceivedMessage> recv_message(int sock, std::span<std::byte> buffer, size_t max_fds,
                                     uint32_t timeout_ms) noexcept;

struct PeerCredentials {
  pid_t pid;
  uid_t uid;
  gid_t gid;
};

// SO_PEERCRED of a connected socket: the peer's credentials at connect time.
Result<PeerCredentials> peer_credentials(int sock) noexcept;

// SO_PEERGROUPS: the peer's supplementary groups at connect time (at most 256 are read).
Result<std::vector<gid_t>> peer_groups(int sock) noexcept;

}  // namespace kdn::ipc
