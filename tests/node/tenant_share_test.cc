// Daemon-wide tables seen by a tenant who wants to lock the others out: one uid's sessions may
// hold only their share of the model table (max_models_per_uid), so another tenant's new model
// still finds room. Runs the real kdnd binary; acting as another uid needs root.
#include "kdnd_process.h"
#include "raw_client.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

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
  if (::getuid() != 0) GTEST_SKIP() << "acting as another uid needs root";
  KdndProcess d({"--set", "max_models_total=8", "--set", "max_models_per_uid=4", "--set",
                 "namespace.default.allow_uids=4101"});
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

}  // namespace
}  // namespace kdn::testing
