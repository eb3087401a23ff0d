#include <kdn/ipc/handshake.h>

#include <sys/socket.h>
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
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

// Namespaces name directories and metrics labels: a conservative alphabet, no "." or "..".
bool is_valid_name_space(std::string_view ns) noexcept {
  if (ns.empty() || ns.size() >= kNameSpaceBytes || ns.front() == '.') return false;
  for (char c : ns) {
    if (!is_name_char(c)) return false;
  }
  return true;
}

// Where the hello keeps its magic and proto_major (the same in every major): enough to tell
// a peer of another major version KDN_ERR_VERSION even if its message has another size.
struct VersionPrefix {
  uint32_t magic;
  size_t major_offset;
};
constexpr VersionPrefix kHelloPrefix{kHelloMagic, offsetof(HelloMsg, proto_major)};

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

bool is_zero(const void* p, size_t n) noexcept {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (b[i] != 0) return false;
  }
  return true;
}

Status check_staging_bytes(uint64_t bytes) noexcept {
  if (bytes % kPageBytes != 0 || bytes >= kMaxStagingBytes) {
    return Status(Code::kInvalidArgument, "staging_bytes must be a 4 KiB multiple below 1 TiB");
  }
  return OkStatus();
}

Status check_region(const RegionRecord& r) noexcept {
  const bool kind_ok = r.kind == uint32_t(RegionKind::kHostArena) || r.kind == uint32_t(RegionKind::kStaging);
  const bool access_ok = r.access == uint32_t(RegionAccess::kRead) || r.access == uint32_t(RegionAccess::kReadWrite);
  if (r.region_id == 0 || r.generation == 0 || r.bytes == 0 || !kind_ok || !access_ok || r.reserved != 0) {
    return Status(Code::kProtocol, "welcome describes an impossible region");
  }
  return OkStatus();
}

Status check_regions(const WelcomeMsg& w) noexcept {
  if (w.num_regions == 0 || w.num_regions > kMaxWelcomeRegions) {
    return Status(Code::kProtocol, "welcome has a bad region count");
  }
  for (uint32_t i = 0; i < kMaxWelcomeRegions; ++i) {
    if (i >= w.num_regions) {
      if (!is_zero(&w.regions[i], sizeof w.regions[i]))
        return Status(Code::kProtocol, "unused welcome region is not zero");
      continue;
    }
    KDN_RETURN_IF_ERROR(check_region(w.regions[i]));
    for (uint32_t j = 0; j < i; ++j) {
      if (w.regions[j].region_id == w.regions[i].region_id) return Status(Code::kProtocol, "welcome repeats a region");
    }
  }
  return OkStatus();
}

Status check_welcome_success(const WelcomeMsg& w, size_t num_fds, const HelloMsg& hello) noexcept {
  KDN_RETURN_IF_ERROR(check_regions(w));
  if (num_fds != kWelcomeFdFirstRegion + w.num_regions || w.num_fds != num_fds) {
    return Status(Code::kProtocol, "welcome carries the wrong number of fds");
  }
  if (w.session_id == 0) return Status(Code::kProtocol, "welcome has no session id");
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
              w.payload_offset == layout->payload_offset && w.session_segment_bytes == layout->total_bytes;
  if (!same) return Status(Code::kProtocol, "welcome layout differs from the computed one");
  const SessionLimits& l = w.limits;
  if (l.max_leases == 0 || l.max_lease_count == 0 || l.max_reservations == 0 || l.max_in_flight == 0 ||
      l.max_models == 0) {
    return Status(Code::kProtocol, "welcome announces a zero limit");
  }
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
  KDN_RETURN_IF_ERROR(check_staging_bytes(r.staging_bytes));
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
  h.staging_bytes = r.staging_bytes;
  return h;
}

Status parse_hello(std::span<const std::byte> bytes, HelloMsg* out) noexcept {
  KDN_RETURN_IF_ERROR(check_prefix(bytes, kHelloPrefix));
  if (bytes.size() != sizeof(HelloMsg)) return Status(Code::kProtocol, "hello has the wrong size");
  HelloMsg h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  if ((h.flags & ~kHelloKnownFlags) != 0) return Status(Code::kProtocol, "hello has unknown flags");
  if (h.reserved != 0) return Status(Code::kProtocol, "hello reserved field is not zero");
  if (!is_clean_cstring(h.name_space, sizeof(h.name_space)) || !is_clean_cstring(h.token, sizeof(h.token))) {
    return Status(Code::kProtocol, "hello string not NUL-terminated or not zero-padded");
  }
  if (!is_valid_name_space(h.name_space)) return Status(Code::kInvalidArgument, "bad namespace name");
  Result<SessionLayout> layout = SessionLayout::compute(h.ring_entries, h.payload_bytes);
  if (!layout.ok()) return layout.status();
  KDN_RETURN_IF_ERROR(check_staging_bytes(h.staging_bytes));
  if (h.client_pid == 0) return Status(Code::kProtocol, "hello has no client pid");
  *out = h;
  return OkStatus();
}

WelcomeMsg make_welcome(const HelloMsg& hello, const SessionLayout& layout, uint64_t session_id, uint32_t granted_flags,
                        std::span<const RegionRecord> regions, const SessionLimits& limits) noexcept {
  WelcomeMsg w{};
  w.magic = kWelcomeMagic;
  w.status = KDN_OK;
  w.proto_major = kProtocolMajor;
  w.proto_minor = kProtocolMinor;
  w.flags = granted_flags & hello.flags;
  w.session_id = session_id;
  w.session_segment_bytes = layout.total_bytes;
  w.ring_entries = layout.ring_entries;
  w.payload_bytes = layout.payload_bytes;
  w.sq_offset = layout.sq_offset;
  w.cq_offset = layout.cq_offset;
  w.payload_offset = layout.payload_offset;
  w.num_regions = uint32_t(regions.size() < kMaxWelcomeRegions ? regions.size() : kMaxWelcomeRegions);
  for (uint32_t i = 0; i < w.num_regions; ++i) w.regions[i] = regions[i];
  w.num_fds = kWelcomeFdFirstRegion + w.num_regions;
  w.max_keys_per_op = kMaxKeysPerOp;
  w.limits = limits;
  return w;
}

WelcomeRefusal make_refusal(Code code) noexcept {
  WelcomeRefusal w{};
  w.magic = kWelcomeMagic;
  w.status = code == Code::kOk ? KDN_ERR_INTERNAL : static_cast<int32_t>(code);
  w.proto_major = kProtocolMajor;
  w.proto_minor = kProtocolMinor;
  return w;
}

Status parse_welcome(std::span<const std::byte> bytes, size_t num_fds, const HelloMsg& hello,
                     WelcomeMsg* out) noexcept {
  // Magic, status and version sit at the same offsets in every layout, so a refusal of any
  // daemon is read before the size is judged.
  if (bytes.size() < offsetof(WelcomeMsg, flags)) return Status(Code::kProtocol, "welcome too short");
  WelcomeMsg w{};
  std::memcpy(&w, bytes.data(), offsetof(WelcomeMsg, flags));
  if (w.magic != kWelcomeMagic) return Status(Code::kProtocol, "welcome has a bad magic");
  *out = w;
  if (w.status < 0) {
    if (num_fds != 0) return Status(Code::kProtocol, "refusal carries fds");
    if (w.status < KDN_ERR_LIMIT) return Status(Code::kProtocol, "refusal with an unknown status");
    if (w.proto_major != kProtocolMajor) return Status(Code::kVersion, "kdnd speaks another protocol version");
    return Status(static_cast<Code>(w.status), "kdnd refused the session");
  }
  if (w.status > 0) return Status(Code::kProtocol, "welcome with a positive status");
  if (w.proto_major != kProtocolMajor) return Status(Code::kVersion, "kdnd speaks another protocol version");
  if (bytes.size() != sizeof(WelcomeMsg)) return Status(Code::kProtocol, "welcome has the wrong size");
  std::memcpy(&w, bytes.data(), sizeof(w));
  *out = w;
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

Result<ReceivedHello> server_receive_hello(int sock, uint32_t timeout_ms, HelloRefusalInfo* why) noexcept {
  HelloRefusalInfo info;
  Result<PeerCredentials> peer = peer_credentials(sock);
  if (peer.ok()) info.peer = *peer;
  std::array<std::byte, kReceiveBytes> buffer;
  Result<ReceivedMessage> msg = recv_message(sock, buffer, 0, timeout_ms);
  if (msg.ok() && msg->bytes >= offsetof(HelloMsg, proto_minor)) {
    std::memcpy(&info.client_major, buffer.data() + offsetof(HelloMsg, proto_major), sizeof info.client_major);
  }
  if (why != nullptr) *why = info;
  if (!msg.ok()) return msg.status();
  if (!peer.ok()) return peer.status();
  ReceivedHello r{};
  KDN_RETURN_IF_ERROR(parse_hello(std::span(buffer).first(msg->bytes), &r.hello));
  if (static_cast<uint32_t>(peer->pid) != r.hello.client_pid) {
    return Status(Code::kPermission, "hello pid differs from the socket's peer pid");
  }
  r.peer = *peer;
  return r;
}

Status server_send_welcome(int sock, const WelcomeMsg& welcome, int session_fd, int doorbell_fd,
                           std::span<const int> region_fds) noexcept {
  if (region_fds.size() != welcome.num_regions) return Status(Code::kInternal, "one fd per region");
  std::array<int, kMaxWelcomeFds> fds{};
  fds[kWelcomeFdSession] = session_fd;
  fds[kWelcomeFdDoorbell] = doorbell_fd;
  for (size_t i = 0; i < region_fds.size(); ++i) fds[kWelcomeFdFirstRegion + i] = region_fds[i];
  return send_message(sock, std::as_bytes(std::span(&welcome, 1)),
                      std::span<const int>(fds.data(), kWelcomeFdFirstRegion + region_fds.size()));
}

Status server_send_refusal(int sock, Code code) noexcept {
  WelcomeRefusal w = make_refusal(code);
  return send_message(sock, std::as_bytes(std::span(&w, 1)), {});
}

Status server_refuse(int sock, Code code) noexcept {
  const Status sent = server_send_refusal(sock, code);
  // Shut first: a hello sent after this fails with EPIPE instead of waiting unread, and the
  // client's next read still finds the refusal.
  (void)::shutdown(sock, SHUT_RDWR);
  std::byte sink[256];
  while (::recv(sock, sink, sizeof sink, MSG_DONTWAIT) > 0) {}
  return sent;
}

Result<ClientHandshake> client_handshake(int sock, const HelloMsg& hello, uint32_t timeout_ms) noexcept {
  // kdnd may refuse a connection before its hello arrives (a uid it admits nowhere, too many
  // pending handshakes) and close it: the send then fails, but the refusal is still there to
  // read and says why.
  const Status sent = send_message(sock, std::as_bytes(std::span(&hello, 1)), {});
  if (!sent.ok() && sent.code() != Code::kUnavailable) return sent;
  std::array<std::byte, kReceiveBytes> buffer;
  Result<ReceivedMessage> msg = recv_message(sock, buffer, kMaxWelcomeFds, sent.ok() ? timeout_ms : 0);
  // A kdnd that closed the socket with our hello unread makes this read fail (ECONNRESET)
  // once, before the refusal it sent: read again.
  if (!msg.ok() && msg.status().code() == Code::kUnavailable) {
    Result<ReceivedMessage> again = recv_message(sock, buffer, kMaxWelcomeFds, 0);
    if (again.ok()) msg = std::move(again);
  }
  if (!msg.ok()) return sent.ok() ? msg.status() : sent;
  ClientHandshake hs{};
  KDN_RETURN_IF_ERROR(parse_welcome(std::span(buffer).first(msg->bytes), msg->num_fds, hello, &hs.welcome));
  hs.session_fd = std::move(msg->fds[kWelcomeFdSession]);
  hs.doorbell_fd = std::move(msg->fds[kWelcomeFdDoorbell]);
  for (uint32_t i = 0; i < hs.welcome.num_regions; ++i) {
    hs.region_fds[i] = std::move(msg->fds[kWelcomeFdFirstRegion + i]);
  }
  return hs;
}

}  // namespace kdn::ipc
