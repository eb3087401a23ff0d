// RawClient: a protocol client built from the ipc layer alone, as a client written from
// docs/protocol.md would be. Tests use it to put any bytes in the rings, keep their mappings
// after kdnd closed them, and reach the descriptors libkdn hides.
#pragma once

#include "kdnd_process.h"

#include <kdn/ipc/handshake.h>
#include <kdn/ipc/ops.h>
#include <kdn/ipc/session.h>
#include <kdn/ipc/uds.h>

#include <cstring>
#include <string>

namespace kdn::testing {

struct RawClientOptions {
  uint32_t payload_bytes = 1 << 20;
  uint64_t staging_bytes = 0;
  const char* name_space = "default";
  const char* token = "";
  uint32_t flags = 0;  // ipc::kHelloFlag*
};

struct RawClient {
  ipc::UniqueFd sock;
  ipc::ClientSession s;
  bool ok = false;
  Status refused;  // why the handshake failed, if it did

  explicit RawClient(const KdndProcess& d, uint32_t payload = 1 << 20) : RawClient(d, RawClientOptions{payload}) {}
  RawClient(const KdndProcess& d, const RawClientOptions& o) {
    auto fd = ipc::uds_connect(d.socket(), 2000);
    if (!fd.ok()) {
      refused = fd.status();
      return;
    }
    sock = std::move(*fd);
    ipc::HelloRequest req;
    req.name_space = o.name_space;
    req.token = o.token;
    req.payload_bytes = o.payload_bytes;
    req.staging_bytes = o.staging_bytes;
    req.flags = o.flags;
    auto hello = ipc::make_hello(req);
    auto hs = ipc::client_handshake(sock.get(), *hello, 2000);
    if (!hs.ok()) {
      refused = hs.status();
      return;
    }
    auto cs = ipc::ClientSession::attach(std::move(*hs));
    if (!cs.ok()) {
      refused = cs.status();
      return;
    }
    s = std::move(*cs);
    ok = true;
  }

  // Submits one SQE and returns its CQE status (or a transport error code).
  int call(ipc::Sqe q, ipc::Cqe* out = nullptr) {
    static uint64_t ud = 1;
    q.user_data = ud++;
    auto n = s.submit(std::span<const ipc::Sqe>(&q, 1));
    if (!n.ok() || *n != 1) return -1000;
    for (;;) {
      ipc::Cqe c;
      auto r = s.reap(std::span<ipc::Cqe>(&c, 1));
      if (!r.ok()) return r.status().raw();
      if (*r == 1) {
        if (out) *out = c;
        return c.user_data == q.user_data ? c.status : -2000;
      }
      Status st = s.wait_for_completion(2'000'000'000);
      if (!st.ok()) return st.raw();
    }
  }
  int ping() {
    ipc::Sqe q{};
    q.opcode = uint8_t(ipc::Opcode::kPing);
    return call(q);
  }
  uint32_t register_model(const kdn_model_desc& desc) {
    const ipc::ModelRecord d = ipc::to_wire(desc);
    std::memcpy(s.payload(), &d, sizeof d);
    ipc::Sqe q{};
    q.opcode = uint8_t(ipc::Opcode::kRegisterModel);
    q.in_len = sizeof d;
    ipc::Cqe c{};
    return call(q, &c) == KDN_OK ? uint32_t(c.res[0]) : 0;
  }
  uint32_t register_tiny() { return register_model(tiny_model()); }
  bool admin() const { return (s.welcome().flags & ipc::kHelloFlagAdmin) != 0; }
};

}  // namespace kdn::testing
