// docs/protocol.md's handshake checks (section 3.1), checked against kdnd: the test reads the
// table of steps, and for every row shows kdnd a connection or hello with that cause and
// expects the row's status. Then, for every two rows it can put in one hello, it sends a hello
// with both causes and expects the earlier step's status, as the document promises. A row the
// document adds without a probe here fails the test. Runs the real kdnd binary; the rows about
// other uids need root (the test skips without it).
#include "doc_table.h"
#include "kdnd_process.h"
#include "raw_client.h"

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kdn::testing {
namespace {

constexpr const char* kToken = "s3cret";

// A hello as bytes on the wire, with or without a descriptor beside it.
struct Hello {
  std::vector<std::byte> bytes;
  bool with_fd = false;
  ipc::HelloMsg& msg() { return *reinterpret_cast<ipc::HelloMsg*>(bytes.data()); }
};

Hello good_hello(const char* name_space = "default", uint64_t staging = 0) {
  ipc::HelloRequest req;
  req.name_space = name_space;
  req.token = kToken;
  req.payload_bytes = 1 << 16;
  req.staging_bytes = staging;
  auto h = ipc::make_hello(req);
  Hello out;
  out.bytes.resize(sizeof(ipc::HelloMsg));
  if (h.ok()) std::memcpy(out.bytes.data(), &*h, sizeof *h);
  return out;
}

// What kdnd answers `h` on a new connection: the welcome's or refusal's status (KDN_OK for a
// welcome, whose session ends when the socket closes here), or a large negative number if no
// answer came. `socket` is kept open while `keep` is set, for the rows that need sessions.
int answer(const std::string& socket, const Hello& h, ipc::UniqueFd* keep = nullptr) {
  auto fd = ipc::uds_connect(socket, 2000);
  if (!fd.ok()) return -1000;
  const int passed = fd->get();  // any descriptor will do
  (void)ipc::send_message(fd->get(), h.bytes, h.with_fd ? std::span<const int>(&passed, 1) : std::span<const int>());
  std::array<std::byte, 512> buf;
  auto msg = ipc::recv_message(fd->get(), buf, ipc::kMaxMessageFds, 3000);
  // A kdnd that closed the socket with our hello unread makes the first read fail (a reset)
  // before the refusal it sent is read.
  if (!msg.ok() && msg.status().code() == Code::kUnavailable) msg = ipc::recv_message(fd->get(), buf, 8, 0);
  if (!msg.ok()) return -2000;
  if (msg->bytes < 8) return -3000;
  int32_t status;
  std::memcpy(&status, buf.data() + 4, sizeof status);  // magic, then status, in every welcome
  if (keep != nullptr && status == KDN_OK) *keep = std::move(*fd);
  return status;
}

// Opens `n` sessions with `h`; false unless all were welcomed. A refusal is tried again for a
// while: the session KdndProcess pinged kdnd with may not have been reaped yet.
bool hold_sessions(const std::string& socket, const Hello& h, int n, std::vector<ipc::UniqueFd>* held) {
  for (int i = 0; i < n; ++i) {
    ipc::UniqueFd fd;
    int st = answer(socket, h, &fd);
    for (int tries = 0; st == KDN_ERR_LIMIT && tries < 100; ++tries) {
      ::usleep(10000);
      st = answer(socket, h, &fd);
    }
    if (st != KDN_OK) return false;
    held->push_back(std::move(fd));
  }
  return true;
}

// `fn` as uid `uid` in a child process; its answer (a kdn_status), or a positive number if the
// child could not become `uid`.
int as_uid(uint32_t uid, const std::function<int()>& fn) {
  const int code = in_child([&] {
    if (::setgid(uid) != 0 || ::setuid(uid) != 0) return 99;
    return -fn();  // exit codes are 0..255; statuses are small negatives
  });
  return code == 99 ? 99 : -code;
}

// One row's cause: a change to a good hello sent to the shared kdnd, or a scenario run against a
// kdnd of its own started with `settings`.
struct Probe {
  std::function<void(Hello&)> change;
  std::function<int(const KdndProcess&)> scenario;
  std::vector<std::string> settings;
  bool needs_root = false;
};

void set_name(Hello& h, const char* name) {
  std::memset(h.msg().name_space, 0, sizeof h.msg().name_space);
  std::strncpy(h.msg().name_space, name, sizeof h.msg().name_space - 1);
}

// Settings of the shared kdnd: a token on every namespace, uid 4101 admitted to "default",
// a "closed" namespace only uid 4102 (and root) may open, no room for a third namespace, and
// two connections of a uid may wait for their hello.
const std::vector<std::string> kShared = {"--token", kToken,
                                          "--set",   "namespace.default.allow_uids=4101",
                                          "--set",   "namespace.closed.allow_uids=4102",
                                          "--set",   "max_namespaces=2",
                                          "--set",   "max_pending_handshakes_per_uid=2",
                                          "--set",   "handshake_timeout_ms=30000"};
// Two namespaces, 2 sessions guaranteed to each of the 4; two connections may wait in all.
const std::vector<std::string> kSessions = {
    "--set", "max_sessions=4",           "--set", "namespace.other.allow_uids=4102",
    "--set", "max_pending_handshakes=2", "--set", "handshake_timeout_ms=30000"};

std::map<std::string, Probe> probes() {
  std::map<std::string, Probe> p;
  auto change = [&p](const char* cause, std::function<void(Hello&)> f) { p[cause].change = std::move(f); };
  auto scenario = [&p](const char* cause, std::vector<std::string> settings, std::function<int(const KdndProcess&)> f,
                       bool root = false) {
    p[cause] = Probe{{}, std::move(f), std::move(settings), root};
  };
  // Step 0: at accept.
  scenario(
      "no namespace admits the peer's uid or groups and it may not create one", kShared,
      [](const KdndProcess& d) { return as_uid(4109, [&] { return answer(d.socket(), good_hello()); }); }, true);
  scenario("`max_pending_handshakes_per_uid` connections of its uid wait for their hello", kShared,
           [](const KdndProcess& d) {
             auto a = ipc::uds_connect(d.socket(), 2000), b = ipc::uds_connect(d.socket(), 2000);
             return a.ok() && b.ok() ? answer(d.socket(), good_hello()) : -1000;
           });
  scenario("`max_pending_handshakes` connections wait for their hello", kSessions, [](const KdndProcess& d) {
    auto a = ipc::uds_connect(d.socket(), 2000), b = ipc::uds_connect(d.socket(), 2000);
    return a.ok() && b.ok() ? answer(d.socket(), good_hello()) : -1000;
  });
  // Steps 1-15: one hello each.
  change("descriptors with the hello", [](Hello& h) { h.with_fd = true; });
  change("an empty message", [](Hello& h) { h.bytes.clear(); });
  change("fewer than 6 bytes", [](Hello& h) { h.bytes.resize(5); });
  change("another `magic`", [](Hello& h) { h.bytes[0] = std::byte{'X'}; });
  change("another `proto_major`", [](Hello& h) { h.msg().proto_major = 1; });
  change("not exactly 168 bytes", [](Hello& h) { h.bytes.push_back(std::byte{0}); });
  change("unknown flag bits", [](Hello& h) { h.msg().flags |= 1u << 7; });
  change("a nonzero reserved field", [](Hello& h) { h.msg().reserved = 1; });
  change("a string field without a NUL",
         [](Hello& h) { std::memset(h.msg().name_space, 'a', sizeof h.msg().name_space); });
  change("a nonzero byte after a string's NUL", [](Hello& h) {
    std::memset(h.msg().token, 0, sizeof h.msg().token);
    std::memcpy(h.msg().token, "s3\0x", 4);
  });
  change("a namespace name outside its alphabet", [](Hello& h) { set_name(h, ".hidden"); });
  change("`ring_entries` not a power of two in [16, 4096]", [](Hello& h) { h.msg().ring_entries = 100; });
  change("`payload_bytes` not a multiple of 4096 in [4 KiB, 64 MiB]", [](Hello& h) { h.msg().payload_bytes = 5000; });
  change("`staging_bytes` not a multiple of 4096 below 1 TiB", [](Hello& h) { h.msg().staging_bytes = 1ull << 40; });
  change("`client_pid` zero", [](Hello& h) { h.msg().client_pid = 0; });
  change("`client_pid` not the socket's SO_PEERCRED pid", [](Hello& h) { h.msg().client_pid = 1; });
  change("a namespace that does not exist, not asked to be created", [](Hello& h) {
    set_name(h, "nosuch");
    h.msg().flags &= ~ipc::kHelloFlagCreateNamespace;
  });
  change("a new namespace when `max_namespaces` exist", [](Hello& h) {
    set_name(h, "third");
    h.msg().flags |= ipc::kHelloFlagCreateNamespace;
  });
  change("a token that is not the namespace's (compared in constant time)", [](Hello& h) {
    std::memset(h.msg().token, 0, sizeof h.msg().token);
    std::memcpy(h.msg().token, "guess", 5);
  });
  scenario(
      "a new namespace asked for by a uid that may not create one", kShared,
      [](const KdndProcess& d) {
        Hello h = good_hello("fourth");
        h.msg().flags |= ipc::kHelloFlagCreateNamespace;
        return as_uid(4101, [&] {
          h.msg().client_pid = uint32_t(::getpid());
          return answer(d.socket(), h);
        });
      },
      true);
  scenario(
      "a uid that is not root, not in the namespace's `allow_uids`, with no gid in its `allow_gids`", kShared,
      [](const KdndProcess& d) { return as_uid(4101, [&] { return answer(d.socket(), good_hello("closed")); }); },
      true);
  // Step 16: limits, on three kdnds whose settings let each row show alone.
  auto refused_after = [](const KdndProcess& d, std::vector<std::pair<const char*, int>> hold, Hello next) {
    std::vector<ipc::UniqueFd> held;
    for (const auto& [ns, n] : hold)
      if (!hold_sessions(d.socket(), good_hello(ns), n, &held)) return -1000;
    return answer(d.socket(), next);
  };
  scenario("`max_sessions` sessions open", kSessions, [=](const KdndProcess& d) {
    return refused_after(d, {{"default", 2}, {"other", 2}}, good_hello("other"));
  });
  scenario(
      "the free sessions are what other namespaces are still guaranteed (`sessions_reserved_per_namespace`, once "
      "this namespace holds its own)",
      kSessions, [=](const KdndProcess& d) {
        return refused_after(d, {{"default", 2}}, good_hello());
      });
  const std::vector<std::string> caps = {"--set", "max_sessions_per_uid=3", "--set", "namespace.capped.max_sessions=2"};
  scenario("`max_sessions_per_uid` sessions of the uid open", caps, [=](const KdndProcess& d) {
    return refused_after(d, {{"default", 3}}, good_hello());
  });
  scenario("the namespace's `max_sessions` open", caps, [=](const KdndProcess& d) {
    return refused_after(d, {{"capped", 2}}, good_hello("capped"));
  });
  // KdndProcess's own ping asks for libkdn's 256 MiB of staging; the uid may hold two such
  // sessions, a namespace one.
  const std::vector<std::string> staging = {"--set", "max_staging_bytes=256M",
                                            "--set", "max_staging_bytes_per_uid=512M",
                                            "--set", "max_staging_bytes_per_namespace=256M",
                                            "--set", "namespace.b.allow_uids=4102",
                                            "--set", "namespace.c.allow_uids=4102"};
  scenario("`staging_bytes` above `max_staging_bytes`", staging,
           [](const KdndProcess& d) { return answer(d.socket(), good_hello("default", 512 << 20)); });
  scenario("`staging_bytes` above what is left of `max_staging_bytes_per_namespace`", staging,
           [](const KdndProcess& d) {
             std::vector<ipc::UniqueFd> held;
             return hold_sessions(d.socket(), good_hello("default", 256 << 20), 1, &held)
                        ? answer(d.socket(), good_hello("default", 4096))
                        : -1000;
           });
  scenario("`staging_bytes` above what is left of `max_staging_bytes_per_uid`", staging, [](const KdndProcess& d) {
    std::vector<ipc::UniqueFd> held;
    return hold_sessions(d.socket(), good_hello("default", 256 << 20), 1, &held) &&
                   hold_sessions(d.socket(), good_hello("b", 256 << 20), 1, &held)
               ? answer(d.socket(), good_hello("c", 4096))
               : -1000;
  });
  return p;
}

int status_code(const std::string& name) {
  static const std::map<std::string, int> codes = {
      {"KDN_ERR_PERMISSION", KDN_ERR_PERMISSION}, {"KDN_ERR_BUSY", KDN_ERR_BUSY},
      {"KDN_ERR_PROTOCOL", KDN_ERR_PROTOCOL},     {"KDN_ERR_UNAVAILABLE", KDN_ERR_UNAVAILABLE},
      {"KDN_ERR_VERSION", KDN_ERR_VERSION},       {"KDN_ERR_INVALID_ARGUMENT", KDN_ERR_INVALID_ARGUMENT},
      {"KDN_ERR_NOT_FOUND", KDN_ERR_NOT_FOUND},   {"KDN_ERR_LIMIT", KDN_ERR_LIMIT},
  };
  auto it = codes.find(name);
  return it == codes.end() ? 1 : it->second;
}

struct Row {
  int step = -1;
  std::string cause;
  int status = 1;
};

std::vector<Row> handshake_table() {
  std::vector<Row> rows;
  for (const auto& cells :
       doc_table(std::string(KDN_SOURCE_DIR) + "/docs/protocol.md", "### 3.1 HelloMsg", "| step | cause | status |")) {
    if (cells.size() != 3) return {};
    rows.push_back({std::atoi(cells[0].c_str()), cells[1], status_code(doc_cell(cells[2], " `"))});
  }
  return rows;
}

class HandshakeChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    rows_ = handshake_table();
    ASSERT_GE(rows_.size(), 20u) << "the table of docs/protocol.md section 3.1 was not found";
    shared_ = std::make_unique<KdndProcess>(kShared);
    // Other uids reach the socket (the rows about them).
    ::chmod(shared_->dir().c_str(), 0755);
    ::chmod(shared_->socket().c_str(), 0777);
    ASSERT_EQ(answer(shared_->socket(), good_hello()), KDN_OK) << "the unchanged hello is welcomed";
  }
  // The kdnd started with `settings` (one per distinct list, shared by the rows naming it).
  const KdndProcess& daemon_for(const std::vector<std::string>& settings) {
    if (settings == kShared) return *shared_;
    auto& d = others_[settings];
    if (!d) {
      d = std::make_unique<KdndProcess>(settings);
      ::chmod(d->dir().c_str(), 0755);
      ::chmod(d->socket().c_str(), 0777);
    }
    return *d;
  }
  std::vector<Row> rows_;
  std::unique_ptr<KdndProcess> shared_;
  std::map<std::vector<std::string>, std::unique_ptr<KdndProcess>> others_;
  const std::map<std::string, Probe> probes_ = probes();
};

TEST_F(HandshakeChecks, EveryRowIsWhatKdndAnswers) {
  int checked = 0;
  for (const Row& r : rows_) {
    auto p = probes_.find(r.cause);
    if (p == probes_.end()) {
      ADD_FAILURE() << "docs/protocol.md section 3.1 lists the cause '" << r.cause << "', which no probe shows";
      continue;
    }
    ++checked;
    const Probe& probe = p->second;
    if (probe.needs_root && ::getuid() != 0) continue;  // counted: the table and the probes still match
    int got;
    if (probe.change) {
      Hello h = good_hello();
      probe.change(h);
      got = answer(shared_->socket(), h);
    } else {
      got = probe.scenario(daemon_for(probe.settings));
    }
    EXPECT_EQ(got, r.status) << "step " << r.step << ": " << r.cause;
  }
  EXPECT_EQ(checked, int(probes_.size())) << "every probe matched a row";
  if (::getuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "the rows about other uids need root; the others passed");
}

// A hello with the causes of two steps gets the earlier step's status: the later cause is put
// in first, then the earlier one (which may overwrite it; the answer must still be the earlier).
TEST_F(HandshakeChecks, TheEarliestStepDecides) {
  int pairs = 0;
  for (const Row& early : rows_) {
    for (const Row& late : rows_) {
      if (late.step <= early.step || late.status == early.status) continue;
      auto e = probes_.find(early.cause), l = probes_.find(late.cause);
      if (e == probes_.end() || l == probes_.end() || !e->second.change || !l->second.change) continue;
      Hello h = good_hello();
      l->second.change(h);
      e->second.change(h);
      EXPECT_EQ(answer(shared_->socket(), h), early.status)
          << "step " << early.step << " (" << early.cause << ") before step " << late.step << " (" << late.cause << ")";
      ++pairs;
    }
  }
  EXPECT_GE(pairs, 50) << "the table gives few pairs of different statuses";
}

}  // namespace
}  // namespace kdn::testing
