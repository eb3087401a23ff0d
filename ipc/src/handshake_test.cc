#include <kdn/ipc/handshake.h>
#include <kdn/ipc/segment.h>

#include "testing/version_one.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

namespace kdn::ipc {
namespace {

HelloMsg good_hello() {
  HelloRequest r;
  r.name_space = "tenant-a";
  r.token = "secret";
  r.ring_entries = 64;
  r.payload_bytes = 1 << 20;
  auto h = make_hello(r);
  EXPECT_TRUE(h.ok());
  return *h;
}

std::vector<std::byte> bytes_of(const HelloMsg& h) {
  std::vector<std::byte> v(sizeof(h));
  std::memcpy(v.data(), &h, sizeof(h));
  return v;
}

Code parse_code(const HelloMsg& h) {
  HelloMsg out;
  return parse_hello(bytes_of(h), &out).code();
}

TEST(Hello, RoundTrips) {
  HelloMsg h = good_hello();
  HelloMsg out{};
  ASSERT_TRUE(parse_hello(bytes_of(h), &out).ok());
  EXPECT_STREQ(out.name_space, "tenant-a");
  EXPECT_STREQ(out.token, "secret");
  EXPECT_EQ(out.ring_entries, 64u);
  EXPECT_EQ(out.client_pid, static_cast<uint32_t>(::getpid()));
  EXPECT_EQ(std::memcmp(&out, &h, sizeof(h)), 0);
}

TEST(Hello, MakeHelloDefaultsAndLimits) {
  HelloRequest r;
  r.name_space = "";
  auto h = make_hello(r);
  ASSERT_TRUE(h.ok());
  EXPECT_STREQ(h->name_space, "default");
  r.name_space = std::string_view("a/b");
  EXPECT_EQ(make_hello(r).status().code(), Code::kInvalidArgument);
  r.name_space = "ok";
  std::string long_token(64, 't');
  r.token = long_token;
  EXPECT_EQ(make_hello(r).status().code(), Code::kInvalidArgument);
  r.token = "";
  r.ring_entries = 100;
  EXPECT_EQ(make_hello(r).status().code(), Code::kInvalidArgument);
}

TEST(Hello, EveryTruncationIsRefused) {
  std::vector<std::byte> b = bytes_of(good_hello());
  HelloMsg out;
  for (size_t n = 0; n < b.size(); ++n) {
    Status s = parse_hello(std::span(b).first(n), &out);
    EXPECT_EQ(s.code(), Code::kProtocol) << "length " << n;
  }
  b.push_back(std::byte{0});
  EXPECT_EQ(parse_hello(b, &out).code(), Code::kProtocol) << "one byte too many";
}

TEST(Hello, WrongMagicAndVersion) {
  HelloMsg h = good_hello();
  h.magic = kWelcomeMagic;
  EXPECT_EQ(parse_code(h), Code::kProtocol);
  h = good_hello();
  h.proto_major = kProtocolMajor + 1;
  EXPECT_EQ(parse_code(h), Code::kVersion);
  // A newer major with a longer hello is still told "version", not "protocol".
  std::vector<std::byte> longer = bytes_of(h);
  longer.resize(longer.size() + 40);
  HelloMsg out;
  EXPECT_EQ(parse_hello(longer, &out).code(), Code::kVersion);
  h = good_hello();
  h.proto_minor = 77;  // minor versions are compatible
  EXPECT_EQ(parse_code(h), Code::kOk);
}

TEST(Hello, StringsMustBeTerminatedAndZeroPadded) {
  HelloMsg h = good_hello();
  std::memset(h.name_space, 'a', sizeof(h.name_space));
  EXPECT_EQ(parse_code(h), Code::kProtocol);
  h = good_hello();
  std::memset(h.token, 'a', sizeof(h.token));
  EXPECT_EQ(parse_code(h), Code::kProtocol);
  h = good_hello();
  h.token[40] = 'x';  // a hidden byte after the terminator
  EXPECT_EQ(parse_code(h), Code::kProtocol);
  h = good_hello();
  h.name_space[50] = 'x';
  EXPECT_EQ(parse_code(h), Code::kProtocol);
}

TEST(Hello, NamespaceAlphabet) {
  for (const char* bad : {"", ".", "..", ".hidden", "a/b", "a b", "tab\t", "\xff"}) {
    HelloMsg h = good_hello();
    std::memset(h.name_space, 0, sizeof(h.name_space));
    std::memcpy(h.name_space, bad, std::strlen(bad));
    EXPECT_EQ(parse_code(h), Code::kInvalidArgument) << bad;
  }
  HelloMsg h = good_hello();
  std::memset(h.name_space, 0, sizeof(h.name_space));
  std::memcpy(h.name_space, "A.b_c-9", 7);
  EXPECT_EQ(parse_code(h), Code::kOk);
}

TEST(Hello, BadSizesAndFields) {
  for (uint32_t entries : {0u, 1u, 8u, 17u, 100u, 8192u, 0x80000000u}) {
    HelloMsg h = good_hello();
    h.ring_entries = entries;
    EXPECT_EQ(parse_code(h), Code::kInvalidArgument) << entries;
  }
  for (uint32_t bytes : {0u, 1000u, 4095u, 4097u, (64u << 20) + 4096, 0xFFFFF000u}) {
    HelloMsg h = good_hello();
    h.payload_bytes = bytes;
    EXPECT_EQ(parse_code(h), Code::kInvalidArgument) << bytes;
  }
  HelloMsg h = good_hello();
  h.flags = 0x80;
  EXPECT_EQ(parse_code(h), Code::kProtocol);
  h = good_hello();
  h.client_pid = 0;
  EXPECT_EQ(parse_code(h), Code::kProtocol);
  h = good_hello();
  h.ring_entries = 16;
  h.payload_bytes = 4096;
  EXPECT_EQ(parse_code(h), Code::kOk) << "the smallest session";
  h.ring_entries = 4096;
  h.payload_bytes = 64u << 20;
  EXPECT_EQ(parse_code(h), Code::kOk) << "the largest session";
  h = good_hello();
  h.staging_bytes = 256u << 20;
  EXPECT_EQ(parse_code(h), Code::kOk);
  h.staging_bytes = 4097;
  EXPECT_EQ(parse_code(h), Code::kInvalidArgument) << "staging in whole pages";
  h = good_hello();
  h.reserved = 1;
  EXPECT_EQ(parse_code(h), Code::kProtocol);
}

// ---- welcome ----------------------------------------------------------------------------------
SessionLimits some_limits() {
  SessionLimits l{};
  l.max_leases = 10;
  l.max_lease_count = 2;
  l.max_reservations = 8;
  l.max_in_flight = 64;
  l.max_models = 4;
  l.reservation_timeout_ms = 1000;
  return l;
}

const RegionRecord kRegions[2] = {
    {7, 1, uint32_t(RegionKind::kHostArena), uint32_t(RegionAccess::kRead), 1u << 30, 0},
    {8, 1, uint32_t(RegionKind::kStaging), uint32_t(RegionAccess::kReadWrite), 1u << 20, 0}};

struct WelcomeCase {
  HelloMsg hello = good_hello();
  SessionLayout layout = *SessionLayout::compute(64, 1 << 20);
  WelcomeMsg welcome = make_welcome(hello, layout, 9, 0, kRegions, some_limits());

  Status parse(size_t fds = kWelcomeFdFirstRegion + 2) {
    WelcomeMsg out;
    return parse_welcome(std::as_bytes(std::span(&welcome, 1)), fds, hello, &out);
  }
};

TEST(Welcome, AcceptsAConsistentWelcome) {
  WelcomeCase c;
  EXPECT_TRUE(c.parse().ok());
}

Status parse_refusal(WelcomeRefusal r, size_t fds = 0) {
  WelcomeMsg out;
  return parse_welcome(std::as_bytes(std::span(&r, 1)), fds, good_hello(), &out);
}

TEST(Welcome, RefusalCarriesTheDaemonsStatus) {
  WelcomeRefusal r = make_refusal(Code::kPermission);
  EXPECT_EQ(parse_refusal(r).code(), Code::kPermission);
  EXPECT_EQ(parse_refusal(r, 1).code(), Code::kProtocol) << "a refusal with fds is malformed";
  EXPECT_EQ(parse_refusal(make_refusal(Code::kLimit)).code(), Code::kLimit);
  r.status = -999;
  EXPECT_EQ(parse_refusal(r).code(), Code::kProtocol);
  r.status = 3;
  EXPECT_EQ(parse_refusal(r).code(), Code::kProtocol);
}

TEST(Welcome, ARefusalOfAnotherMajorIsAVersionError) {
  // What a version-1 daemon sends a version-2 client: its 80-byte welcome, status VERSION.
  WelcomeRefusal r = make_refusal(Code::kVersion);
  r.proto_major = 1;
  EXPECT_EQ(parse_refusal(r).code(), Code::kVersion);
  r.status = KDN_ERR_PERMISSION;
  EXPECT_EQ(parse_refusal(r).code(), Code::kVersion) << "whatever it refused for, it speaks another version";
}

TEST(Welcome, RegionsAreChecked) {
  {
    WelcomeCase c;
    c.welcome.regions[1].generation = 0;
    EXPECT_EQ(c.parse().code(), Code::kProtocol);
  }
  {
    WelcomeCase c;
    c.welcome.regions[1].region_id = c.welcome.regions[0].region_id;
    EXPECT_EQ(c.parse().code(), Code::kProtocol) << "a region twice";
  }
  {
    WelcomeCase c;
    c.welcome.regions[2].bytes = 1;
    EXPECT_EQ(c.parse().code(), Code::kProtocol) << "an unused region slot must be zero";
  }
  {
    WelcomeCase c;
    c.welcome.regions[0].kind = 9;
    EXPECT_EQ(c.parse().code(), Code::kProtocol);
  }
  {
    WelcomeCase c;
    c.welcome.num_regions = 0;
    EXPECT_EQ(c.parse(kWelcomeFdFirstRegion).code(), Code::kProtocol);
  }
  {
    WelcomeCase c;
    c.welcome.limits.max_leases = 0;
    EXPECT_EQ(c.parse().code(), Code::kProtocol);
  }
}

TEST(Welcome, InconsistentWelcomesAreRefused) {
  {
    WelcomeCase c;
    EXPECT_EQ(c.parse(3).code(), Code::kProtocol) << "one fd per region";
  }
  {
    WelcomeCase c;
    c.welcome.cq_offset += 4096;
    EXPECT_EQ(c.parse().code(), Code::kProtocol);
  }
  {
    WelcomeCase c;
    c.welcome.session_segment_bytes -= 1;
    EXPECT_EQ(c.parse().code(), Code::kProtocol);
  }
  {
    WelcomeCase c;
    c.welcome.flags = kHelloFlagAdmin;  // not asked for
    EXPECT_EQ(c.parse().code(), Code::kProtocol);
  }
  {
    WelcomeCase c;
    c.welcome.ring_entries = 128;
    EXPECT_EQ(c.parse().code(), Code::kProtocol);
  }
  {
    WelcomeCase c;
    c.welcome.session_id = 0;
    EXPECT_EQ(c.parse().code(), Code::kProtocol);
  }
  {
    WelcomeCase c;
    c.welcome.proto_major += 1;
    EXPECT_EQ(c.parse().code(), Code::kVersion);
  }
  {
    WelcomeCase c;
    c.welcome.magic = kHelloMagic;
    EXPECT_EQ(c.parse().code(), Code::kProtocol);
  }
  WelcomeCase c;
  WelcomeMsg out;
  EXPECT_EQ(parse_welcome(std::as_bytes(std::span(&c.welcome, 1)).first(40), 4, c.hello, &out).code(), Code::kProtocol);
}

TEST(Token, ComparesWholeTokens) {
  EXPECT_TRUE(token_equals("abc", "abc"));
  EXPECT_TRUE(token_equals("", ""));
  EXPECT_FALSE(token_equals("abc", "abd"));
  EXPECT_FALSE(token_equals("abc", "ab"));
  EXPECT_FALSE(token_equals("", "x"));
}

// ---- over a socket -------------------------------------------------------------------------------
std::pair<UniqueFd, UniqueFd> socket_pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return {};
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

TEST(HandshakeSocket, ServerChecksThePeerPid) {
  auto [client, server] = socket_pair();
  HelloMsg h = good_hello();
  h.client_pid = static_cast<uint32_t>(::getpid()) + 1;  // a lie
  ASSERT_TRUE(send_message(client.get(), std::as_bytes(std::span(&h, 1)), {}).ok());
  EXPECT_EQ(server_receive_hello(server.get(), 1000).status().code(), Code::kPermission);
}

TEST(HandshakeSocket, ServerRefusesAHelloWithDescriptors) {
  auto [client, server] = socket_pair();
  HelloMsg h = good_hello();
  int fd = client.get();
  ASSERT_TRUE(send_message(client.get(), std::as_bytes(std::span(&h, 1)), std::span(&fd, 1)).ok());
  EXPECT_EQ(server_receive_hello(server.get(), 1000).status().code(), Code::kProtocol);
}

TEST(HandshakeSocket, ServerRefusesAnOversizedHello) {
  auto [client, server] = socket_pair();
  std::vector<std::byte> big(4096, std::byte{0});
  ASSERT_TRUE(send_message(client.get(), big, {}).ok());
  EXPECT_EQ(server_receive_hello(server.get(), 1000).status().code(), Code::kProtocol);
}

TEST(HandshakeSocket, ClientGetsWelcomeAndFds) {
  auto [client, server] = socket_pair();
  HelloMsg h = good_hello();
  ASSERT_TRUE(send_message(client.get(), std::as_bytes(std::span(&h, 1)), {}).ok());
  auto rh = server_receive_hello(server.get(), 1000);
  ASSERT_TRUE(rh.ok()) << rh.status().what();
  EXPECT_EQ(rh->peer.pid, ::getpid());
  auto layout = SessionLayout::compute(rh->hello.ring_entries, rh->hello.payload_bytes);
  auto session = SharedSegment::create("hs", layout->total_bytes);
  auto arena = SharedSegment::create("hs-arena", 1 << 20);
  ASSERT_TRUE(session.ok() && arena.ok());
  const RegionRecord regions[1] = {
      {3, 1, uint32_t(RegionKind::kHostArena), uint32_t(RegionAccess::kRead), arena->size(), 0}};
  WelcomeMsg w = make_welcome(rh->hello, *layout, 5, kHelloFlagAdmin, regions, some_limits());
  EXPECT_EQ(w.flags, 0u) << "only flags that were asked for are granted";
  const int region_fd = arena->fd();
  ASSERT_TRUE(server_send_welcome(server.get(), w, session->fd(), server.get(), std::span(&region_fd, 1)).ok());
  // client_handshake sends its own hello first; drain that one on the server side after.
  auto hs = client_handshake(client.get(), h, 1000);
  ASSERT_TRUE(hs.ok()) << hs.status().what();
  EXPECT_EQ(hs->welcome.session_id, 5u);
  EXPECT_TRUE(hs->session_fd.valid() && hs->region_fds[0].valid() && hs->doorbell_fd.valid());
  EXPECT_EQ(hs->welcome.limits.max_lease_count, 2u);
}

TEST(HandshakeSocket, ClientSeesARefusal) {
  auto [client, server] = socket_pair();
  ASSERT_TRUE(server_send_refusal(server.get(), Code::kVersion).ok());
  auto hs = client_handshake(client.get(), good_hello(), 1000);
  EXPECT_EQ(hs.status().code(), Code::kVersion);
}

TEST(HandshakeSocket, AVersionOneHelloIsRefusedInTheVersionOneLayout) {
  auto [client, server] = socket_pair();
  ASSERT_TRUE(send_message(client.get(), testing::version_one_hello(), {}).ok());
  HelloRefusalInfo why;
  auto rh = server_receive_hello(server.get(), 1000, &why);
  EXPECT_EQ(rh.status().code(), Code::kVersion);
  EXPECT_EQ(why.client_major, 1u);
  EXPECT_EQ(why.peer.pid, ::getpid()) << "the daemon knows whom to name in its log";
  ASSERT_TRUE(server_send_refusal(server.get(), rh.status().code()).ok());
  auto seen = testing::read_refusal(client.get(), 1000);
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(seen->bytes, 80u) << "the size of a version-1 welcome";
  EXPECT_EQ(seen->status, KDN_ERR_VERSION);
  EXPECT_EQ(seen->proto_major, 2u);
}

}  // namespace
}  // namespace kdn::ipc

namespace kdn::ipc {
namespace {

// Random corruption of valid messages: every outcome is a clean verdict, and whatever is
// accepted satisfies the documented invariants (ASan/UBSan builds check the rest).
TEST(HandshakeMutation, CorruptedHellosAreRefusedOrValid) {
  std::mt19937_64 rng(2024);
  const std::vector<std::byte> base = bytes_of(good_hello());
  int accepted = 0;
  for (int round = 0; round < 200'000; ++round) {
    std::vector<std::byte> b = base;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) b[rng() % b.size()] ^= std::byte(1u << (rng() % 8));
    if (rng() % 16 == 0) b.resize(rng() % (b.size() + 8));
    HelloMsg out;
    Status s = parse_hello(b, &out);
    if (!s.ok()) continue;
    ++accepted;
    ASSERT_EQ(b.size(), sizeof(HelloMsg));
    ASSERT_NE(std::memchr(out.name_space, 0, sizeof(out.name_space)), nullptr);
    ASSERT_NE(std::memchr(out.token, 0, sizeof(out.token)), nullptr);
    ASSERT_TRUE(SessionLayout::compute(out.ring_entries, out.payload_bytes).ok());
  }
  EXPECT_GT(accepted, 0) << "some flips (e.g. in the token or pid) leave a valid hello";
}

TEST(HandshakeMutation, CorruptedWelcomesAreRefusedOrConsistent) {
  std::mt19937_64 rng(99);
  HelloMsg hello = good_hello();
  auto layout = SessionLayout::compute(hello.ring_entries, hello.payload_bytes);
  WelcomeMsg w = make_welcome(hello, *layout, 3, 0, kRegions, some_limits());
  for (int round = 0; round < 200'000; ++round) {
    WelcomeMsg m = w;
    auto* p = reinterpret_cast<unsigned char*>(&m);
    p[rng() % sizeof(m)] ^= static_cast<unsigned char>(1u << (rng() % 8));
    WelcomeMsg out;
    size_t fds = rng() % 6;
    Status s = parse_welcome(std::as_bytes(std::span(&m, 1)), fds, hello, &out);
    if (s.ok()) {
      ASSERT_EQ(fds, kWelcomeFdFirstRegion + out.num_regions);
      ASSERT_EQ(out.cq_offset, layout->cq_offset);
      ASSERT_EQ(out.session_segment_bytes, layout->total_bytes);
    }
  }
}

}  // namespace
}  // namespace kdn::ipc
