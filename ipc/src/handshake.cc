#include <kdn/ipc/handshake.h>

#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <utility>

namespace kdn::ipc {
namespace {

// Room for a message larger than ours, so a newer peer's hello/welcome is still read whole
// and refused by version rather than by truncation.
constexpr size_t kReceiveBytes = 1024;

// A fixed char field must hold a NUL, and only zeros after it (no hidden bytes).
bool is_clean_cstring(const char* field, size_t size) noexcept {
  const void* nul = std::memchr(field, '\0', size);
  if (nul == nullptr) return false;
  for (const char* p = static_cast<const char*>(nul); p < field + size; ++p) {
    if (*p != '\0') return false;
  }
  return true;
}

bool is_name_char(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

// Namespaces name directories and metrics labels: a conservative alphabet, no "." or "..".
bool is_valid_name_space(std::string_view ns) noexcept {
  if (ns.empty() || ns.size() >= kNameSpaceBytes || ns.front() == '.') return false;
  for (char c : ns) {
    if (!is_name_char(c)) return false;
  }
  return true;
}

// Where each message keeps its magic and proto_major: enough to tell a peer of another
// major version KDN_ERR_VERSION even if its message has another size.
struct VersionPrefix {
  uint32_t magic;
  size_t major_offset;
};
constexpr VersionPrefix kHelloPrefix{kHelloMagic, offsetof(HelloMsg, proto_major)};
constexpr VersionPrefix kWelcomePrefix{kWelcomeMagic, offsetof(WelcomeMsg, proto_major)};

Status check_prefix(std::span<const std::byte> bytes, const VersionPrefix& prefix) noexcept {
  if (bytes.size() < prefix.major_offset + sizeof(uint16_t)) {
    return Status(Code::kProtocol, "handshake message too short");
  }
  uint32_t got_magic;
  uint16_t got_major;
  std::memcpy(&got_magic, bytes.data(), sizeof(got_magic));
  std::memcpy(&got_major, bytes.data() + prefix.major_offset, sizeof(got_major));
  if (got_magic != prefix.magic) return Status(Code::kProtocol, "handshake message has a bad magic");
  if (got_major != kProtocolMajor) return Status(Code::kVersion, "protocol major version mismatch");
  return OkStatus();
}

Status check_welcome_success(const WelcomeMsg& w, size_t num_fds, const HelloMsg& hello) noexcept {
  if (num_fds != kWelcomeFds || w.num_fds != kWelcomeFds) {
    return Status(Code::kProtocol, "welcome carries the wrong number of fds");
  }
  if (w.session_id == 0 || w.arena_bytes == 0) return Status(Code::kProtocol, "welcome has empty fields");
  if ((w.flags & ~hello.flags) != 0) return Status(Code::kProtocol, "welcome grants flags not asked for");
  if (w.max_keys_per_op == 0 || w.max_keys_per_op > kMaxKeysPerOp) {
    return Status(Code::kProtocol, "welcome has a bad max_keys_per_op");
  }
  if (w.ring_entries != hello.ring_entries || w.payload_bytes != hello.payload_bytes) {
    return Status(Code::kProtocol, "welcome sizes differ from the hello");
  }
  Result<SessionLayout> layout = SessionLayout::compute(w.ring_entries, w.payload_bytes);
  if (!layout.ok()) return Status(Code::kProtocol, "welcome sizes out of range");
  bool same = w.sq_offset == layout->sq_offset && w.cq_offset == layout->cq_offset &&
              w.payload_offset == layout->payload_offset &&
              w.session_segment_bytes == layout->total_bytes;
  if (!same) return Status(Code::kProtocol, "welcome layout differs from the computed one");
  return OkStatus();
}

}  // namespace

Result<HelloMsg> make_hello(const HelloRequest& r) noexcept {
  std::string_view ns = r.name_space.empty() ? std::string_view("default") : r.name_space;
  if (!is_valid_name_space(ns)) return Status(Code::kInvalidArgument, "bad namespace name");
  if (r.token.size() >= kTokenBytes || r.token.find('\0') != std::string_view::npos) {
    return Status(Code::kInvalidArgument, "token longer than 63 bytes or with a NUL");
  }
  if ((r.flags & ~kHelloKnownFlags) != 0) return Status(Code::kInvalidArgument, "unknown hello flags");
  Result<SessionLayout> layout = SessionLayout::compute(r.ring_entries, r.payload_bytes);
  if (!layout.ok()) return layout.status();
  HelloMsg h{};
  h.magic = kHelloMagic;
  h.proto_major = kProtocolMajor;
  h.proto_minor = kProtocolMinor;
  std::memcpy(h.name_space, ns.data(), ns.size());
  if (!r.token.empty()) std::memcpy(h.token, r.token.data(), r.token.size());
  h.ring_entries = r.ring_entries;
  h.payload_bytes = r.payload_bytes;
  h.client_pid = static_cast<uint32_t>(::getpid());
  h.flags = r.flags;
  return h;
}

Status parse_hello(std::span<const std::byte> bytes, HelloMsg* out) noexcept {
  KDN_RETURN_IF_ERROR(check_prefix(bytes, kHelloPrefix));
  if (bytes.size() != sizeof(HelloMsg)) return Status(Code::kProtocol, "hello has the wrong size");
  HelloMsg h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  if ((h.flags & ~kHelloKnownFlags) != 0) return Status(Code::kProtocol, "hello has unknown flags");
  if (!is_clean_cstring(h.name_space, sizeof(h.name_space)) || !is_clean_cstring(h.token, sizeof(h.token))) {
    return Status(Code::kProtocol, "hello string not NUL-terminated or not zero-padded");
  }
  if (!is_valid_name_space(h.name_space)) return Status(Code::kInvalidArgument, "bad namespace name");
  Result<SessionLayout> layout = SessionLayout::compute(h.ring_entries, h.payload_bytes);
  if (!layout.ok()) return layout.status();
  if (h.client_pid == 0) return Status(Code::kProtocol, "hello has no client pid");
  *out = h;
  return OkStatus();
}

WelcomeMsg make_welcome(const HelloMsg& hello, const SessionLayout& layout, uint64_t session_id,
                        uint64_t arena_bytes, uint32_t granted_flags) noexcept {
  WelcomeMsg w{};
  w.magic = kWelcomeMagic;
  w.status = KDN_OK;
  w.proto_major = kProtocolMajor;
  w.proto_minor = kProtocolMinor;
  w.flags = granted_flags & hello.flags;
  w.session_id = session_id;
  w.session_segment_bytes = layout.total_bytes;
  w.arena_bytes = arena_bytes;
  w.ring_entries = layout.ring_entries;
  w.payload_bytes = layout.payload_bytes;
  w.sq_offset = layout.sq_offset;
  w.cq_offset = layout.cq_offset;
  w.payload_offset = layout.payload_offset;
  w.num_fds = kWelcomeFds;
  w.max_keys_per_op = kMaxKeysPerOp;
  return w;
}

WelcomeMsg make_refusal(Code code) noexcept {
  WelcomeMsg w{};
  w.magic = kWelcomeMagic;
  w.status = code == Code::kOk ? KDN_ERR_INTERNAL : static_cast<int32_t>(code);
  w.proto_major = kProtocolMajor;
  w.proto_minor = kProtocolMinor;
  return w;
}

Status parse_welcome(std::span<const std::byte> bytes, size_t num_fds, const HelloMsg& hello,
                     WelcomeMsg* out) noexcept {
  // A refusal from a daemon of another major: report its status if the size is ours,
  // otherwise KDN_ERR_VERSION.
  Status prefix = check_prefix(bytes, kWelcomePrefix);
  if (prefix.code() == Code::kProtocol) return prefix;
  if (bytes.size() != sizeof(WelcomeMsg)) {
    return prefix.ok() ? Status(Code::kProtocol, "welcome has the wrong size") : prefix;
  }
  WelcomeMsg w;
  std::memcpy(&w, bytes.data(), sizeof(w));
  *out = w;
  if (w.status < 0) {
    if (num_fds != 0 || w.num_fds != 0) return Status(Code::kProtocol, "refusal carries fds");
    if (w.status < KDN_ERR_INTERNAL) return Status(Code::kProtocol, "refusal with an unknown status");
    return Status(static_cast<Code>(w.status), "kdnd refused the session");
  }
  if (w.status > 0) return Status(Code::kProtocol, "welcome with a positive status");
  KDN_RETURN_IF_ERROR(prefix);
  return check_welcome_success(w, num_fds, hello);
}

bool token_equals(const char* a, const char* b) noexcept {
  // Only the lengths leak through timing, never the position of the first difference.
  size_t la = ::strnlen(a, kTokenBytes);
  size_t lb = ::strnlen(b, kTokenBytes);
  unsigned diff = la != lb ? 1u : 0u;
  for (size_t i = 0; i < kTokenBytes; ++i) {
    unsigned ca = i < la ? static_cast<unsigned char>(a[i]) : 0u;
    unsigned cb = i < lb ? static_cast<unsigned char>(b[i]) : 0u;
    diff |= ca ^ cb;
  }
  return diff == 0;
}

Result<ReceivedHello> server_receive_hello(int sock, uint32_t timeout_ms) noexcept {
  std::array<std::byte, kReceiveBytes> buffer;
  Result<ReceivedMessage> msg = recv_message(sock, buffer, 0, timeout_ms);
  if (!msg.ok()) return msg.status();
  ReceivedHello r{};
  KDN_RETURN_IF_ERROR(parse_hello(std::span(buffer).first(msg->bytes), &r.hello));
  Result<PeerCredentials> peer = peer_credentials(sock);
  if (!peer.ok()) return peer.status();
  if (static_cast<uint32_t>(peer->pid) != r.hello.client_pid) {
    return Status(Code::kPermission, "hello pid differs from the socket's peer pid");
  }
  r.peer = *peer;
  return r;
}

Status server_send_welcome(int sock, const WelcomeMsg& welcome, int session_fd, int arena_fd,
                           int doorbell_fd) noexcept {
  std::array<int, kWelcomeFds> fds{};
  fds[kWelcomeFdSession] = session_fd;
  fds[kWelcomeFdArena] = arena_fd;
  fds[kWelcomeFdDoorbell] = doorbell_fd;
  return send_message(sock, std::as_bytes(std::span(&welcome, 1)), fds);
}

Status server_send_refusal(int sock, Code code) noexcept {
  WelcomeMsg w = make_refusal(code);
  return send_message(sock, std::as_bytes(std::span(&w, 1)), {});
}

Result<ClientHandshake> client_handshake(int sock, const HelloMsg& hello, uint32_t timeout_ms) noexcept {
  KDN_RETURN_IF_ERROR(send_message(sock, std::as_bytes(std::span(&hello, 1)), {}));
  std::array<std::byte, kReceiveBytes> buffer;
  Result<ReceivedMessage> msg = recv_message(sock, buffer, kWelcomeFds, timeout_ms);
  if (!msg.ok()) return msg.status();
  ClientHandshake hs{};
  KDN_RETURN_IF_ERROR(parse_welcome(std::span(buffer).first(msg->bytes), msg->num_fds, hello, &hs.welcome));
  hs.session_fd = std::move(msg->fds[kWelcomeFdSession]);
  hs.arena_fd = std::move(msg->fds[kWelcomeFdArena]);
  hs.doorbell_fd = std::move(msg->fds[kWelcomeFdDoorbell]);
  return hs;
}

}  // namespace kdn::ipc
