// docs/protocol.md's error table, checked against kdnd: the test reads the table (section 8),
// and for every cause a row lists it sends a request showing that cause and expects the row's
// status. A cause the document adds without a probe here fails the test, so the table and kdnd
// cannot drift apart unnoticed. Runs the real kdnd binary.
#include "doc_table.h"
#include "kdnd_process.h"
#include "raw_client.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace kdn::testing {
namespace {

struct Row {
  std::string cause;   // one cause of a row (the cells list them separated by commas)
  std::string status;  // e.g. KDN_ERR_PROTOCOL
};

// The "| cause | status |" table of section 8, one Row per comma-separated cause.
std::vector<Row> error_table() {
  std::vector<Row> rows;
  for (const auto& cells :
       doc_table(std::string(KDN_SOURCE_DIR) + "/docs/protocol.md", "## 8. Errors", "| cause | status |")) {
    if (cells.empty()) continue;
    const std::string status = doc_cell(cells.back(), " `");
    // Commas inside parentheses belong to one cause.
    int depth = 0;
    std::string cur;
    for (char c : cells.front()) {
      depth += c == '(' ? 1 : c == ')' ? -1 : 0;
      if (c == ',' && depth == 0) {
        rows.push_back({doc_cell(cur, " `"), status});
        cur.clear();
      } else {
        cur += c;
      }
    }
    rows.push_back({doc_cell(cur, " `"), status});
  }
  return rows;
}

ipc::Sqe sqe(ipc::Opcode op) {
  ipc::Sqe q{};
  q.opcode = uint8_t(op);
  return q;
}

struct Fixture {
  RawClient& c;        // a session with a model registered
  RawClient& admin;    // an admin session
  uint32_t model = 0;  // c's model
};

// Each probe: a request showing one cause, sent on the fixture's sessions; returns its status.
using Probe = std::function<int(Fixture&)>;

std::map<std::string, Probe> probes() {
  const uint32_t key = sizeof(kdn_key);
  return {
      {"unknown opcode", [](Fixture& f) { return f.c.call(sqe(ipc::Opcode(250))); }},
      {"admin opcode without admin rights", [](Fixture& f) { return f.c.call(sqe(ipc::Opcode::kEvict)); }},
      {"nonzero flags or reserved field",
       [](Fixture& f) {
         ipc::Sqe q = sqe(ipc::Opcode::kPing);
         q.flags = 1;
         const int a = f.c.call(q);
         q = sqe(ipc::Opcode::kPing);
         q.reserved = 1;
         return a == f.c.call(q) ? a : -1;
       }},
      {"reference outside the area",
       [key](Fixture& f) {
         ipc::Sqe q = sqe(ipc::Opcode::kLookup);
         q.model_id = f.model;
         q.in_off = f.c.s.welcome().payload_bytes - key / 2;
         q.in_len = key;
         return f.c.call(q);
       }},
      {"partial record",
       [key](Fixture& f) {
         ipc::Sqe q = sqe(ipc::Opcode::kLookup);
         q.model_id = f.model;
         q.in_len = key + 1;
         return f.c.call(q);
       }},
      {"payload on an opcode that takes none",
       [key](Fixture& f) {
         ipc::Sqe q = sqe(ipc::Opcode::kPing);
         q.in_len = key;
         return f.c.call(q);
       }},
      {"not exactly one record where one is required",
       [](Fixture& f) {
         ipc::Sqe q = sqe(ipc::Opcode::kRegisterModel);
         q.in_len = 2 * sizeof(ipc::ModelRecord);
         return f.c.call(q);
       }},
      {"a model name without a NUL",
       [](Fixture& f) {
         ipc::ModelRecord rec = ipc::to_wire(tiny_model());
         std::memset(rec.name, 'x', sizeof rec.name);
         std::memcpy(f.c.s.payload(), &rec, sizeof rec);
         ipc::Sqe q = sqe(ipc::Opcode::kRegisterModel);
         q.in_len = sizeof rec;
         return f.c.call(q);
       }},
      {"more than 65536 records",
       [key](Fixture& f) {
         ipc::Sqe q = sqe(ipc::Opcode::kLookup);
         q.model_id = f.model;
         q.in_len = 65537 * key;
         return f.c.call(q);
       }},
      {"output too small",
       [key](Fixture& f) {
         ipc::Sqe q = sqe(ipc::Opcode::kLease);
         q.model_id = f.model;
         q.in_len = 2 * key;
         q.out_off = 4 * key;
         q.out_len = sizeof(ipc::LeaseRecord);  // two keys, room for one record
         return f.c.call(q);
       }},
      {"unknown EVICT mode",
       [](Fixture& f) {
         ipc::Sqe q = sqe(ipc::Opcode::kEvict);
         q.arg[0] = 99;
         return f.admin.call(q);
       }},
      {"keys with EVICT mode 0",
       [key](Fixture& f) {
         ipc::Sqe q = sqe(ipc::Opcode::kEvict);
         q.in_len = key;
         return f.admin.call(q);
       }},
      {"a model id this session did not register",
       [](Fixture& f) {
         ipc::Sqe q = sqe(ipc::Opcode::kLookup);
         q.model_id = f.model + 1000;
         q.in_len = sizeof(kdn_key);
         return f.c.call(q);
       }},
      {"a handle that is not the session's",
       [](Fixture& f) {
         const uint64_t id = 424242;
         std::memcpy(f.c.s.payload(), &id, sizeof id);
         ipc::Sqe q = sqe(ipc::Opcode::kRelease);
         q.in_len = sizeof id;
         return f.c.call(q);
       }},
      {"a configured limit (section 3.2's `SessionLimits`, staging space, models)",  // max_models is 1 here
       [](Fixture& f) {
         kdn_model_desc other = tiny_model();
         other.engine_salt[0] = 7;
         const ipc::ModelRecord rec = ipc::to_wire(other);
         std::memcpy(f.c.s.payload(), &rec, sizeof rec);
         ipc::Sqe q = sqe(ipc::Opcode::kRegisterModel);
         q.in_len = sizeof rec;
         return f.c.call(q);
       }},
  };
}

// Causes no request of a well-behaved test can show, and where they are checked instead.
const std::map<std::string, std::string> kCheckedElsewhere = {
    {"kdnd ran out of memory serving the request (the request alone fails, what it took is rolled back)",
     "request_handler_test fails each allocation of a request in turn"},
};

int status_code(const std::string& name) {
  static const std::map<std::string, int> codes = {
      {"KDN_ERR_UNSUPPORTED", KDN_ERR_UNSUPPORTED}, {"KDN_ERR_PERMISSION", KDN_ERR_PERMISSION},
      {"KDN_ERR_PROTOCOL", KDN_ERR_PROTOCOL},       {"KDN_ERR_INVALID_ARGUMENT", KDN_ERR_INVALID_ARGUMENT},
      {"KDN_ERR_NOT_FOUND", KDN_ERR_NOT_FOUND},     {"KDN_ERR_LIMIT", KDN_ERR_LIMIT},
      {"KDN_ERR_NO_MEMORY", KDN_ERR_NO_MEMORY},
  };
  auto it = codes.find(name);
  return it == codes.end() ? 1 : it->second;
}

TEST(ProtocolErrors, EveryRowOfTheErrorTableIsWhatKdndAnswers) {
  const std::vector<Row> rows = error_table();
  ASSERT_GE(rows.size(), 10u) << "the table of docs/protocol.md section 8 was not found";
  KdndProcess d({"--set", "max_models=1"});
  RawClient c(d, 4 << 20);
  RawClient admin(d, RawClientOptions{1 << 20, 0, "default", "", ipc::kHelloFlagAdmin});
  ASSERT_TRUE(c.ok && admin.ok && admin.admin());
  Fixture f{c, admin, c.register_tiny()};
  ASSERT_NE(f.model, 0u);
  const auto all = probes();
  int checked = 0;
  for (const Row& r : rows) {
    if (kCheckedElsewhere.count(r.cause)) continue;
    auto p = all.find(r.cause);
    if (p == all.end()) {
      ADD_FAILURE() << "docs/protocol.md lists the cause '" << r.cause << "' (" << r.status
                    << "), which no probe shows";
      continue;
    }
    EXPECT_EQ(p->second(f), status_code(r.status)) << r.cause << " should be " << r.status;
    EXPECT_EQ(c.ping(), KDN_OK) << "the session goes on after '" << r.cause << "'";
    ++checked;
  }
  EXPECT_EQ(checked, int(all.size())) << "every probe matched a row";
}

}  // namespace
}  // namespace kdn::testing
