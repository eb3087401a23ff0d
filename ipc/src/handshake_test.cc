#include <kdn/ipc/handshake.h>
#include <kdn/ipc/segment.h>

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
}

// ---- welcome ----------------------------------------------------------------------------------
struct WelcomeCase {
  HelloMsg hello = good_hello();
  SessionLayout layout = *SessionLayout::compute(64, 1 << 20);
  WelcomeMsg welcome = make_welcome(hello, layout, 9, 1 << 30, 0);

  Status parse(size_t fds = kWelcomeFds) {
    WelcomeMsg out;
    return parse_welcome(std::as_bytes(std::span(&welcome, 1)), fds, hello, &out);
  }
};

TEST(Welcome, AcceptsAConsistentWelcome) {
  WelcomeCase c;
  EXPECT_TRUE(c.parse().ok());
}

TEST(Welcome, RefusalCarriesTheDaemonsStatus) {
  WelcomeCase c;
  c.welcome = make_refusal(Code::kPermission);
  EXPECT_EQ(c.parse(0).code(), Code::kPermission);
  EXPECT_EQ(c.parse(1).code(), Code::kProtocol) << "a refusal with fds is malformed";
  c.welcome.status = -999;
  EXPECT_EQ(c.parse(0).code(), Code::kProtocol);
  c.welcome.status = 3;
  EXPECT_EQ(c.parse(0).code(), Code::kProtocol);
}

TEST(Welcome, InconsistentWelcomesAreRefused) {
  {
    WelcomeCase c;
    EXPECT_EQ(c.parse(2).code(), Code::kProtocol);
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
  EXPECT_EQ(parse_welcome(std::as_bytes(std::span(&c.welcome, 1)).first(40), 3, c.hello, &out).code(),
            Code::kProtocol);
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
  WelcomeMsg w = make_welcome(rh->hello, *layout, 5, arena->size(), kHelloFlagAdmin);
  EXPECT_EQ(w.flags, 0u) << "only flags that were asked for are granted";
  ASSERT_TRUE(server_send_welcome(server.get(), w, session->fd(), arena->fd(), server.get()).ok());
  // client_handshake sends its own hello first; drain that one on the server side after.
  auto hs = client_handshake(client.get(), h, 1000);
  ASSERT_TRUE(hs.ok()) << hs.status().what();
  EXPECT_EQ(hs->welcome.session_id, 5u);
  EXPECT_TRUE(hs->session_fd.valid() && hs->arena_fd.valid() && hs->doorbell_fd.valid());
}

TEST(HandshakeSocket, ClientSeesARefusal) {
  auto [client, server] = socket_pair();
  ASSERT_TRUE(server_send_refusal(server.get(), Code::kVersion).ok());
  auto hs = client_handshake(client.get(), good_hello(), 1000);
  EXPECT_EQ(hs.status().code(), Code::kVersion);
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
  WelcomeMsg w = make_welcome(hello, *layout, 3, 1 << 20, 0);
  for (int round = 0; round < 200'000; ++round) {
    WelcomeMsg m = w;
    auto* p = reinterpret_cast<unsigned char*>(&m);
    p[rng() % sizeof(m)] ^= static_cast<unsigned char>(1u << (rng() % 8));
    WelcomeMsg out;
    size_t fds = rng() % 5;
    Status s = parse_welcome(std::as_bytes(std::span(&m, 1)), fds, hello, &out);
    if (s.ok()) {
      ASSERT_EQ(fds, kWelcomeFds);
      ASSERT_EQ(out.cq_offset, layout->cq_offset);
      ASSERT_EQ(out.session_segment_bytes, layout->total_bytes);
    }
  }
}

}  // namespace
}  // namespace kdn::ipc
