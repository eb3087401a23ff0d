// Hostile and broken clients: every malformed handshake, ring entry or payload reference is
// answered with an error (or that client's session is closed), and kdnd keeps serving
// everyone else.
#include "kdnd_process.h"
#include "raw_client.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/handshake.h>
#include <kdn/ipc/session.h>
#include <kdn/ipc/uds.h>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <vector>

namespace kdn::testing {
namespace {

using ipc::Opcode;

// A well-behaved client that must keep working whatever the others do.
void expect_healthy(const KdndProcess& d) {
  ASSERT_TRUE(d.alive()) << "kdnd died";
  kdn_connect_opts o = d.opts();
  kdn_client* c = nullptr;
  ASSERT_EQ(kdn_connect(&o, &c), KDN_OK);
  EXPECT_EQ(kdn_ping(c), KDN_OK);
  kdn_disconnect(c);
}

TEST(BadInput, MalformedEntriesGetErrorCompletions) {
  KdndProcess d;
  RawClient r(d);
  ASSERT_TRUE(r.ok);
  const uint32_t model = r.register_tiny();
  ASSERT_NE(model, 0u);
  ipc::Sqe q{};

  q = {};
  q.opcode = 200;  // unknown opcode
  EXPECT_EQ(r.call(q), KDN_ERR_UNSUPPORTED);
  q = {};
  q.opcode = 0;
  EXPECT_EQ(r.call(q), KDN_ERR_UNSUPPORTED);

  q = {};
  q.opcode = uint8_t(Opcode::kLookup);
  q.model_id = model;
  q.in_off = (1u << 20) - 8;  // runs past the payload area
  q.in_len = 32;
  EXPECT_EQ(r.call(q), KDN_ERR_PROTOCOL);
  q.in_off = 0xFFFFFFF0u;  // off + len wraps around u32
  q.in_len = 0x20;
  EXPECT_EQ(r.call(q), KDN_ERR_PROTOCOL);
  q.in_off = 0;
  q.in_len = 24;  // not a whole number of keys
  EXPECT_EQ(r.call(q), KDN_ERR_PROTOCOL);

  q = {};
  q.opcode = uint8_t(Opcode::kLookup);
  q.model_id = 12345;  // never registered
  q.in_len = 16;
  EXPECT_EQ(r.call(q), KDN_ERR_NOT_FOUND);

  q = {};
  q.opcode = uint8_t(Opcode::kLease);
  q.model_id = model;
  q.in_len = 64 * 16;
  q.out_off = 4096;
  q.out_len = 16;  // output smaller than one slot per key
  EXPECT_EQ(r.call(q), KDN_ERR_INVALID_ARGUMENT);

  q = {};
  q.opcode = uint8_t(Opcode::kPing);
  q.flags = 0x80;  // undefined flag bits
  EXPECT_EQ(r.call(q), KDN_ERR_PROTOCOL);

  q = {};
  q.opcode = uint8_t(Opcode::kCommit);
  uint64_t bogus = 0xdeadbeef;
  std::memcpy(r.s.payload(), &bogus, 8);
  q.in_len = 8;
  EXPECT_EQ(r.call(q), KDN_ERR_NOT_FOUND);
  q.opcode = uint8_t(Opcode::kRelease);
  EXPECT_EQ(r.call(q), KDN_ERR_NOT_FOUND);

  q = {};
  q.opcode = uint8_t(Opcode::kList);  // admin opcode on a normal session
  q.out_len = 4096;
  EXPECT_EQ(r.call(q), KDN_ERR_PERMISSION);

  // A hostile model descriptor (all 0xff bytes).
  std::memset(r.s.payload(), 0xff, sizeof(ipc::ModelRecord));
  q = {};
  q.opcode = uint8_t(Opcode::kRegisterModel);
  q.in_len = sizeof(ipc::ModelRecord);
  EXPECT_LT(r.call(q), 0);

  EXPECT_EQ(r.ping(), KDN_OK) << "the session survives its own bad requests";
  expect_healthy(d);
}

TEST(BadInput, OversizedKeyArrays) {
  KdndProcess d;
  RawClient r(d, 4u << 20);
  ASSERT_TRUE(r.ok);
  const uint32_t model = r.register_tiny();
  ipc::Sqe q{};
  q.opcode = uint8_t(Opcode::kLookup);
  q.model_id = model;
  q.in_len = (ipc::kMaxKeysPerOp + 1) * 16;  // fits the area, exceeds the per-op limit
  EXPECT_EQ(r.call(q), KDN_ERR_INVALID_ARGUMENT);
  q.in_len = ipc::kMaxKeysPerOp * 16;  // the limit itself is fine (all misses)
  std::memset(r.s.payload(), 0x5a, q.in_len);
  EXPECT_EQ(r.call(q), KDN_OK);
  expect_healthy(d);
}

TEST(BadInput, RandomEntriesNeverHurtTheDaemon) {
  KdndProcess d;
  RawClient r(d);
  ASSERT_TRUE(r.ok);
  r.register_tiny();
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 5000; ++i) {
    ipc::Sqe q{};
    auto* w = reinterpret_cast<uint64_t*>(&q);
    for (size_t j = 0; j < sizeof q / 8; ++j) w[j] = rng();
    q.opcode = uint8_t(1 + rng() % 12);
    if (rng() % 2) {
      q.in_off %= 1u << 20;
      q.in_len %= 4096;
      q.out_off %= 1u << 20;
      q.out_len %= 8192;
    }
    if (rng() % 2) q.flags = 0;
    if (rng() % 2) q.model_id = 1;
    if (rng() % 2) q.arg[0] = 0;
    int st = r.call(q);
    ASSERT_GT(st, -1000) << "transport broke at entry " << i;
  }
  EXPECT_EQ(r.ping(), KDN_OK);
  expect_healthy(d);
}

TEST(BadInput, CorruptedRingClosesOnlyThatSession) {
  KdndProcess d;
  RawClient bad(d), good(d);
  ASSERT_TRUE(bad.ok && good.ok);
  // Publish an impossible SQ tail (far beyond capacity).
  const auto& w = bad.s.welcome();
  std::byte* base = bad.s.payload() - w.payload_offset;
  auto* tail = reinterpret_cast<std::atomic<uint32_t>*>(base + w.sq_offset + 64);
  tail->store(0x7fff0000u, std::memory_order_release);
  // The daemon drops the bad session (its socket hangs up) the next time it polls the
  // rings; the good client's requests wake it.
  bool closed = false;
  for (int i = 0; i < 200 && !closed; ++i) {
    EXPECT_EQ(good.ping(), KDN_OK);
    char b;
    closed = ::recv(bad.sock.get(), &b, 1, MSG_DONTWAIT) == 0;
    usleep(10000);
  }
  EXPECT_TRUE(closed);
  EXPECT_EQ(good.ping(), KDN_OK);
  expect_healthy(d);
}

TEST(BadInput, HandshakeGarbage) {
  KdndProcess d;
  {
    auto fd = ipc::uds_connect(d.socket(), 1000);
    ASSERT_TRUE(fd.ok());
    std::vector<std::byte> junk(100, std::byte{0x41});
    ASSERT_TRUE(ipc::send_message(fd->get(), junk, {}).ok());
    ipc::WelcomeRefusal w{};
    // Refused or closed, never a welcome with fds.
    ssize_t n = ::recv(fd->get(), &w, sizeof w, 0);
    EXPECT_TRUE(n <= 0 || w.status < 0);
  }
  {
    auto fd = ipc::uds_connect(d.socket(), 1000);
    ASSERT_TRUE(fd.ok());
    auto hello = ipc::make_hello({});
    hello->proto_major = 99;  // wrong version
    std::span<const std::byte> b(reinterpret_cast<const std::byte*>(&*hello), sizeof *hello);
    ASSERT_TRUE(ipc::send_message(fd->get(), b, {}).ok());
    ipc::WelcomeRefusal w{};
    ssize_t n = ::recv(fd->get(), &w, sizeof w, 0);
    ASSERT_EQ(n, ssize_t(sizeof w)) << "a refusal in the layout every major reads";
    EXPECT_EQ(w.status, KDN_ERR_VERSION);
    EXPECT_EQ(w.proto_major, ipc::kProtocolMajor);
  }
  {
    auto fd = ipc::uds_connect(d.socket(), 1000);
    auto hello = ipc::make_hello({});
    std::memset(hello->name_space, 'x', sizeof hello->name_space);  // no NUL terminator
    std::span<const std::byte> b(reinterpret_cast<const std::byte*>(&*hello), sizeof *hello);
    ASSERT_TRUE(ipc::send_message(fd->get(), b, {}).ok());
    ipc::WelcomeRefusal w{};
    ssize_t n = ::recv(fd->get(), &w, sizeof w, 0);
    EXPECT_TRUE(n <= 0 || w.status < 0);
  }
  expect_healthy(d);
}

TEST(BadInput, SilentClientDoesNotBlockOthers) {
  KdndProcess d({"--spin-us", "10"});
  auto silent = ipc::uds_connect(d.socket(), 1000);  // connects, never says hello
  ASSERT_TRUE(silent.ok());
  const uint64_t t0 = now_ns();
  expect_healthy(d);
  EXPECT_LT(now_ns() - t0, 1'000'000'000ull) << "a silent client stalled the daemon";
  // It is cut off after the handshake timeout (2 s by default).
  char b;
  bool closed = false;
  for (int i = 0; i < 400 && !closed; ++i) {
    closed = ::recv(silent->get(), &b, 1, MSG_DONTWAIT) == 0;
    usleep(10000);
  }
  EXPECT_TRUE(closed);
}

TEST(BadInput, TokenAndNamespaceChecks) {
  KdndProcess d({"--token", "s3cret"});
  kdn_connect_opts o = d.opts();
  kdn_client* c = nullptr;
  o.token = nullptr;
  EXPECT_EQ(kdn_connect(&o, &c), KDN_ERR_PERMISSION);
  o.token = "wrong";
  EXPECT_EQ(kdn_connect(&o, &c), KDN_ERR_PERMISSION);
  o.token = "s3cret";
  o.name_space = "../etc";
  EXPECT_NE(kdn_connect(&o, &c), KDN_OK);
  o.name_space = "team-a";
  EXPECT_EQ(kdn_connect(&o, &c), KDN_ERR_NOT_FOUND) << "a namespace nobody declared or asked to create";
  o.flags = KDN_CONNECT_CREATE_NAMESPACE;
  ASSERT_EQ(kdn_connect(&o, &c), KDN_OK);
  EXPECT_EQ(kdn_ping(c), KDN_OK);
  kdn_disconnect(c);
}

TEST(BadInput, ApiArgumentChecks) {
  KdndProcess d;
  kdn_connect_opts o = d.opts();
  kdn_client* c = nullptr;
  ASSERT_EQ(kdn_connect(&o, &c), KDN_OK);
  kdn_model_desc desc = tiny_model();
  kdn_model* m = nullptr;
  EXPECT_EQ(kdn_register_model(c, nullptr, &m), KDN_ERR_INVALID_ARGUMENT);
  desc.struct_size = 3;
  EXPECT_EQ(kdn_register_model(c, &desc, &m), KDN_ERR_VERSION);
  desc = tiny_model();
  desc.head_dim = 0;
  EXPECT_EQ(kdn_register_model(c, &desc, &m), KDN_ERR_INVALID_ARGUMENT);
  desc = tiny_model();
  ASSERT_EQ(kdn_register_model(c, &desc, &m), KDN_OK);
  kdn_lookup_result r{};
  EXPECT_EQ(kdn_lookup(c, m, nullptr, 5, &r), KDN_ERR_INVALID_ARGUMENT);
  auto tok = doc_tokens(1, 8);
  EXPECT_EQ(kdn_lookup(c, m, tok.data(), tok.size(), &r), KDN_OK) << "partial chunk: a miss";
  EXPECT_EQ(r.hit_chunks, 0u);
  kdn_store* s = nullptr;
  EXPECT_EQ(kdn_store_reserve(c, m, tok.data(), tok.size(), 0, 1, &s), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_STRNE(kdn_strerror(KDN_ERR_NO_SPACE), kdn_strerror(-12345));
  kdn_disconnect(c);
}

}  // namespace
}  // namespace kdn::testing
