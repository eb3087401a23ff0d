// Daemon-wide tables seen by a tenant who wants to lock the others out: one uid's sessions may
// hold only their share of the model table (max_models_per_uid), so another tenant's new model
// still finds room, and one namespace's uids together leave every other namespace its
// guaranteed models (models_reserved_per_namespace); one namespace's sessions leave every
// other namespace its guaranteed sessions (sessions_reserved_per_namespace); and a full pending-handshake table makes
// room for a uid that holds fewer of it. Runs the real kdnd binary; acting as another uid needs root.
#include "kdnd_process.h"
#include "raw_client.h"

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace kdn::testing {
namespace {

// A model of its own for each `n` (the descriptors differ only in the engine salt).
kdn_model_desc model_number(uint8_t n) {
  kdn_model_desc d = tiny_model();
  d.engine_salt[0] = n;
  return d;
}

// REGISTER_MODEL's status.
int register_status(RawClient& c, uint8_t n) {
  const ipc::ModelRecord rec = ipc::to_wire(model_number(n));
  std::memcpy(c.s.payload(), &rec, sizeof rec);
  ipc::Sqe q{};
  q.opcode = uint8_t(ipc::Opcode::kRegisterModel);
  q.in_len = sizeof rec;
  return c.call(q);
}

TEST(TenantShares, OneUidsSessionsCannotFillTheModelTable) {
  if (::getuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "acting as another uid needs root");
  KdndProcess d(
      {"--set", "max_models_total=8", "--set", "max_models_per_uid=4", "--set", "namespace.default.allow_uids=4101"});
  ::chmod(d.dir().c_str(), 0755);  // let uid 4101 reach the socket
  ::chmod(d.socket().c_str(), 0777);
  RawClient a(d), b(d);  // root's sessions: one tenant
  ASSERT_TRUE(a.ok && b.ok);
  for (uint8_t n = 1; n <= 3; ++n) EXPECT_EQ(register_status(a, n), KDN_OK) << n;
  EXPECT_EQ(register_status(b, 4), KDN_OK);
  EXPECT_EQ(register_status(b, 5), KDN_ERR_LIMIT) << "a fifth model across the uid's sessions";
  EXPECT_EQ(register_status(a, 6), KDN_ERR_LIMIT);
  EXPECT_EQ(register_status(b, 1), KDN_OK) << "a model the uid already holds costs no share";
  // Another tenant, while root's sessions hold their four: its models still fit.
  EXPECT_EQ(in_child([&] {
              if (::setgid(4101) != 0 || ::setuid(4101) != 0) return 99;
              RawClient other(d);
              if (!other.ok) return 1;
              for (uint8_t n = 11; n <= 14; ++n)
                if (register_status(other, n) != KDN_OK) return 10 + n;
              return register_status(other, 15) == KDN_ERR_LIMIT ? 0 : 2;
            }),
            0);
  // Root's share comes back as its sessions end.
  a.sock.reset();
  b.sock.reset();
  bool freed = false;
  for (int i = 0; i < 100 && !freed; ++i) {
    RawClient c(d);
    freed = c.ok && register_status(c, 7) == KDN_OK;
    if (!freed) usleep(20000);
  }
  EXPECT_TRUE(freed);
}

TEST(TenantShares, OneNamespaceCannotFillTheModelTable) {
  // Two namespaces and 8 model slots, 4 guaranteed to each: the tenants of "default" (root's
  // sessions, each uid under its own max_models_per_uid) take their 4 and what nobody is owed
  // (none here), and uid 4101's new models in "other" still find their 4 slots.
  if (::getuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "acting as another uid needs root");
  KdndProcess d({"--set", "max_models_total=8", "--set", "max_models_per_uid=8", "--set",
                 "models_reserved_per_namespace=4", "--set", "namespace.other.allow_uids=4101"});
  ::chmod(d.dir().c_str(), 0755);
  ::chmod(d.socket().c_str(), 0777);
  RawClient a(d), b(d);
  ASSERT_TRUE(a.ok && b.ok);
  int taken = 0;
  for (uint8_t n = 1; n <= 8 && register_status(n % 2 ? a : b, n) == KDN_OK; ++n) ++taken;
  EXPECT_EQ(taken, 4) << "default's guarantee; the other 4 are other's";
  EXPECT_EQ(register_status(a, 9), KDN_ERR_LIMIT);
  EXPECT_EQ(register_status(b, 1), KDN_OK) << "a model the namespace holds takes no new slot";
  EXPECT_EQ(in_child([&] {
              if (::setgid(4101) != 0 || ::setuid(4101) != 0) return 99;
              RawClient other(d, RawClientOptions{1 << 20, 0, "other"});
              if (!other.ok) return 1;
              for (uint8_t n = 11; n <= 14; ++n)
                if (register_status(other, n) != KDN_OK) return 10 + n;
              return register_status(other, 15) == KDN_ERR_LIMIT ? 0 : 2;  // the table is full now
            }),
            0);
}

// Opens sessions in `ns` until kdnd refuses one; returns them (the refusal's code in *why).
std::vector<std::unique_ptr<RawClient>> sessions_until_refused(const KdndProcess& d, const char* ns, int* why) {
  std::vector<std::unique_ptr<RawClient>> open;
  for (int i = 0; i < 64; ++i) {
    auto c = std::make_unique<RawClient>(d, RawClientOptions{1 << 16, 0, ns});
    if (!c->ok) {
      *why = c->refused.raw();
      break;
    }
    open.push_back(std::move(c));
  }
  return open;
}

TEST(TenantShares, OneNamespaceLeavesTheOthersTheirGuaranteedSessions) {
  // Three namespaces (default, a, b) and 8 sessions, 2 guaranteed to each: a busy namespace
  // gets the 2 nobody owns beside its own 2, and the others still get theirs.
  KdndProcess d({"--set", "max_sessions=8", "--set", "sessions_reserved_per_namespace=2", "--set",
                 "namespace.a.max_bytes=32M", "--set", "namespace.b.max_bytes=32M"});
  int why = 0;
  auto in_a = sessions_until_refused(d, "a", &why);
  EXPECT_EQ(in_a.size(), 4u) << "a's own 2 and the 2 nobody is guaranteed";
  EXPECT_EQ(why, KDN_ERR_LIMIT);
  auto in_b = sessions_until_refused(d, "b", &why);
  EXPECT_EQ(in_b.size(), 2u) << "b's guarantee, although a wanted more";
  auto in_default = sessions_until_refused(d, "default", &why);
  EXPECT_EQ(in_default.size(), 2u);
  EXPECT_EQ(why, KDN_ERR_LIMIT) << "max_sessions";
  // One of b's ends: b gets its slot back, a does not.
  in_b.pop_back();
  bool b_again = false;
  for (int i = 0; i < 100 && !b_again; ++i) {
    RawClient late(d, RawClientOptions{1 << 16, 0, "b"});
    b_again = late.ok;
    if (!b_again) usleep(20000);
  }
  EXPECT_TRUE(b_again);
}

// What kdnd said on a connection within `ms`: the refusal's status, 1 if it is still open and
// quiet, 2 if it closed without a word.
int what_kdnd_said(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, ms) == 0) return 1;
  unsigned char buf[512];
  const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  if (n < 8) return 2;
  int32_t status;
  std::memcpy(&status, buf + 4, sizeof status);  // magic, then status, as in every welcome
  return status;
}

TEST(TenantShares, AFullPendingTableMakesRoomForAUidHoldingLess) {
  if (::getuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "acting as another uid needs root");
  KdndProcess d({"--set", "max_pending_handshakes=4", "--set", "max_pending_handshakes_per_uid=8", "--set",
                 "handshake_timeout_ms=30000", "--set", "namespace.default.allow_uids=4101"});
  ::chmod(d.dir().c_str(), 0755);
  ::chmod(d.socket().c_str(), 0777);
  std::vector<ipc::UniqueFd> silent;  // root's: they fill the table
  for (int i = 0; i < 4; ++i) {
    auto fd = ipc::uds_connect(d.socket(), 2000);
    ASSERT_TRUE(fd.ok());
    silent.push_back(std::move(*fd));
  }
  EXPECT_EQ(in_child([&] {
              if (::setgid(4101) != 0 || ::setuid(4101) != 0) return 99;
              RawClient engine(d);
              return engine.ok && engine.ping() == KDN_OK ? 0 : 1;
            }),
            0)
      << "another uid's engine while one uid's silent connections fill the table";
  int busy = 0, quiet = 0;
  for (auto& fd : silent) {
    const int said = what_kdnd_said(fd.get(), 200);
    busy += said == KDN_ERR_BUSY;
    quiet += said == 1;
  }
  EXPECT_EQ(busy, 1) << "the oldest silent connection gave its slot, and was told why";
  EXPECT_EQ(quiet, 3);
  // Root fills the table again; being its largest holder, it takes nothing from anyone more.
  auto fifth = ipc::uds_connect(d.socket(), 2000);
  ASSERT_TRUE(fifth.ok());
  RawClient more(d);
  EXPECT_FALSE(more.ok);
  EXPECT_EQ(more.refused.code(), Code::kBusy);
}

}  // namespace
}  // namespace kdn::testing
