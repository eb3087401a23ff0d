// The handshake: one HelloMsg from the client, one WelcomeMsg (plus its fds) back.
//
//   client                                   kdnd
//     connect(SOCK_SEQPACKET) ─────────────▶ accept
//     HelloMsg (168 bytes, no fds) ────────▶ server_receive_hello: size, magic, version,
//                                            strings, ranges, SO_PEERCRED pid == client_pid
//                                            (namespace/token/uid policy: the daemon's)
//     client_handshake ◀──────────────────── WelcomeMsg + [session memfd, doorbell eventfd,
//       checks the welcome against the hello     one fd per region (arena read-only, staging)]
//                                              or an 80-byte refusal (status < 0, no fds)
//     maps the segments (session.h)
//
// The socket stays open for the whole session: its hang-up tells kdnd the client is gone
// (leases and reservations are then reclaimed), and tells the client kdnd is gone.
//
// The parse functions take raw received bytes, so a test or fuzzer can feed them anything.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/fd.h>
#include <kdn/ipc/protocol.h>
#include <kdn/ipc/uds.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace kdn::ipc {

// ---- messages -----------------------------------------------------------------------------------
struct HelloRequest {
  std::string_view name_space = "default";  // "" is taken as "default"
  std::string_view token;
  uint32_t ring_entries = 256;
  uint32_t payload_bytes = 1u << 20;
  uint32_t flags = 0;
  uint64_t staging_bytes = 0;  // a multiple of 4 KiB; 0 = a read-only session
};

// A HelloMsg for this process (client_pid = getpid()); KDN_ERR_INVALID_ARGUMENT if a field
// breaks the limits in protocol.h.
Result<HelloMsg> make_hello(const HelloRequest& request) noexcept;

// Validates received bytes as a HelloMsg and copies them to *out. Errors:
//   KDN_ERR_PROTOCOL          wrong size or magic, a string not NUL-terminated or with
//                             bytes after its NUL, unknown flag bits, nonzero reserved bytes
//   KDN_ERR_VERSION           proto_major != kProtocolMajor
//   KDN_ERR_INVALID_ARGUMENT  ring_entries/payload_bytes/staging_bytes out of range, bad
//                             namespace name
Status parse_hello(std::span<const std::byte> bytes, HelloMsg* out) noexcept;

// A successful welcome for `hello`, the session's layout, its regions (1..4; their fds
// travel in this order) and its limits.
WelcomeMsg make_welcome(const HelloMsg& hello, const SessionLayout& layout, uint64_t session_id, uint32_t granted_flags,
                        std::span<const RegionRecord> regions, const SessionLimits& limits) noexcept;
// A refusal carrying `code` (< 0), in the layout every major understands.
WelcomeRefusal make_refusal(Code code) noexcept;

// Validates received bytes and fd count as the answer to `hello` and copies them to *out.
// A refusal is returned as its own status (e.g. KDN_ERR_PERMISSION; KDN_ERR_VERSION when the
// daemon speaks another major) with out->status and proto_major filled. KDN_ERR_PROTOCOL for
// a malformed welcome or fds/status/size/regions that disagree.
Status parse_welcome(std::span<const std::byte> bytes, size_t num_fds, const HelloMsg& hello, WelcomeMsg* out) noexcept;

// Compares two NUL-terminated tokens of at most kTokenBytes in time independent of where
// they differ (the daemon's token check).
bool token_equals(const char* a, const char* b) noexcept;

// ---- socket steps ---------------------------------------------------------------------------------
struct ReceivedHello {
  HelloMsg hello;
  PeerCredentials peer;
};

// What the daemon knows of a hello it refused, for its log.
struct HelloRefusalInfo {
  PeerCredentials peer{};     // pid 0 if SO_PEERCRED failed
  uint16_t client_major = 0;  // the proto_major the client sent (0 if unreadable)
};

// Daemon: reads and validates the hello on an accepted socket. KDN_ERR_PERMISSION if the
// claimed pid is not the SO_PEERCRED pid; KDN_ERR_VERSION for another major (`why` says
// which). The caller answers every error with server_send_refusal (where the socket still
// works) and closes the socket.
Result<ReceivedHello> server_receive_hello(int sock, uint32_t timeout_ms, HelloRefusalInfo* why = nullptr) noexcept;
// Daemon: sends a successful welcome with the session's fds (the caller keeps them): the
// session segment, the doorbell, and one fd per region of welcome.regions.
Status server_send_welcome(int sock, const WelcomeMsg& welcome, int session_fd, int doorbell_fd,
                           std::span<const int> region_fds) noexcept;
Status server_send_refusal(int sock, Code code) noexcept;
// Daemon: sends the refusal and leaves the socket ready to close so that the client reads it
// whenever it sent its hello: nothing more gets in, and what it sent is read and dropped (a
// SOCK_SEQPACKET socket closed with a message unread makes the peer's next read fail with
// ECONNRESET before the refusal). The caller closes the socket.
Status server_refuse(int sock, Code code) noexcept;

struct ClientHandshake {
  WelcomeMsg welcome;
  UniqueFd session_fd;
  UniqueFd doorbell_fd;
  std::array<UniqueFd, kMaxWelcomeRegions> region_fds;  // [0, welcome.num_regions)
};

// Client: sends `hello` on a connected socket and waits for the welcome. A refusal returns
// the daemon's status (KDN_ERR_VERSION, KDN_ERR_PERMISSION, ...).
Result<ClientHandshake> client_handshake(int sock, const HelloMsg& hello, uint32_t timeout_ms) noexcept;

}  // namespace kdn::ipc
