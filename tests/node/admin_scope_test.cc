// What an admin sees, against a tenant's curiosity: a uid in one namespace's admin_uids reads
// that namespace's METRICS series and STATS, but neither another namespace's series nor the
// daemon-wide counters (other tenants' traffic shows in those); an admin of every namespace
// (the top-level admin_uids) reads all of it. Runs the real kdnd binary; acting as another uid
// needs root.
#include "kdnd_process.h"
#include "raw_client.h"

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>

#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace kdn::testing {
namespace {

// The METRICS page the session reads ("" if refused).
std::string metrics_page(RawClient& c) {
  ipc::Sqe q{};
  q.opcode = uint8_t(ipc::Opcode::kMetrics);
  q.out_len = c.s.welcome().payload_bytes;
  ipc::Cqe cqe{};
  if (c.call(q, &cqe) != KDN_OK) return "";
  return std::string(reinterpret_cast<const char*>(c.s.payload()), size_t(cqe.res[0]));
}

// STATS' daemon_sessions word (UINT64_MAX if refused).
uint64_t daemon_sessions(RawClient& c) {
  ipc::Sqe q{};
  q.opcode = uint8_t(ipc::Opcode::kStats);
  q.out_len = sizeof(ipc::StatsRecord);
  if (c.call(q) != KDN_OK) return UINT64_MAX;
  ipc::StatsRecord r;
  std::memcpy(&r, c.s.payload(), sizeof r);
  return r.daemon_sessions;
}

TEST(AdminScope, ANamespaceAdminSeesOnlyWhatItAdministers) {
  if (::getuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "acting as another uid needs root");
  KdndProcess d({"--set", "namespace.a.allow_uids=4101", "--set", "namespace.a.admin_uids=4101", "--set",
                 "namespace.a.max_bytes=32M", "--set", "namespace.b.max_bytes=32M"});
  ::chmod(d.dir().c_str(), 0755);
  ::chmod(d.socket().c_str(), 0777);
  RawClient other_tenant(d, RawClientOptions{1 << 20, 0, "b"});  // traffic the admin of a must not see
  ASSERT_TRUE(other_tenant.ok);
  RawClient node_admin(d, RawClientOptions{1 << 20, 0, "a", "", ipc::kHelloFlagAdmin});
  ASSERT_TRUE(node_admin.ok && node_admin.admin());
  const std::string whole = metrics_page(node_admin);
  EXPECT_NE(whole.find("namespace=\"b\""), std::string::npos) << "the admin of every namespace sees b";
  EXPECT_NE(whole.find("\nkdn_sessions "), std::string::npos);
  EXPECT_GE(daemon_sessions(node_admin), 2u);
  EXPECT_EQ(in_child([&] {
              if (::setgid(4101) != 0 || ::setuid(4101) != 0) return 99;
              RawClient ns_admin(d, RawClientOptions{1 << 20, 0, "a", "", ipc::kHelloFlagAdmin});
              if (!ns_admin.ok || !ns_admin.admin()) return 1;
              const std::string page = metrics_page(ns_admin);
              if (page.find("kdn_namespace_sessions{namespace=\"a\"}") == std::string::npos) return 2;
              if (page.find("namespace=\"b\"") != std::string::npos) return 3;
              if (page.find("namespace=\"default\"") != std::string::npos) return 4;
              if (page.find("kdn_sessions ") != std::string::npos) return 5;
              if (page.find("kdn_handshakes_refused_total") != std::string::npos) return 6;
              if (page.find("kdn_request_duration_seconds") != std::string::npos) return 7;
              return daemon_sessions(ns_admin) == 0 ? 0 : 8;
            }),
            0)
      << "1: no admin session; 2: its own series missing; 3-7: another namespace's or daemon-wide "
         "series shown; 8: STATS' daemon-wide words shown";
}

}  // namespace
}  // namespace kdn::testing
