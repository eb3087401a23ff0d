// Reconnection after kdnd went away, and the lifetime of the connections it replaces.
//
// A call on a connection kdnd closed fails with KDN_ERR_UNAVAILABLE at once. A later call
// tries to connect again — at most once per kReconnectIntervalNs, so an engine serving while
// kdnd is down does not hammer the socket — with the namespace, token and flags of the first
// kdn_connect, and registers every model the client had registered: the kdn_model handles the
// engine holds stay valid and get their new ids. Leases, reservations and ops of the old
// connection belong to a session kdnd no longer has: releasing them sends nothing, and the old
// connection stays mapped until the last of them is let go, so a lease's pointers stay valid.
#include "handles.h"

#include <kdn/common/clock.h>
#include <kdn/ipc/ops.h>

#include <algorithm>
#include <cstring>

namespace kdn::shim {

Result<uint32_t> register_on(Client& c, const ModelInfo& info) {
  using Op = ipc::RegisterModelOp;
  const Op::InRecord rec = ipc::to_wire(info.desc);
  auto in = c.alloc_payload(sizeof rec);
  if (!in.ok()) return in.status();
  std::memcpy(c.payload_ptr(*in), &rec, sizeof rec);
  Request r;
  r.sqe.opcode = uint8_t(Op::kOpcode);
  r.in = *in;
  r.sqe.in_len = sizeof rec;
  auto cqe = c.call(r);
  c.free_payload(*in);
  if (!cqe.ok()) return cqe.status();
  if (cqe->status != KDN_OK) return Status(Code(cqe->status), "kdnd refused the model");
  auto got = Op::result(*cqe);
  if (!got.ok()) return got.status();
  // The daemon derives geometry from the same bytes: any disagreement is a version skew.
  if (got->chunk_bytes != info.chunk_bytes || !(got->fingerprint == info.fingerprint))
    return Status(Code::kVersion, "kdnd disagrees on the model's geometry");
  return got->model_id;
}

void hold(kdn_client* client, Client* owner) noexcept {
  (void)client;
  if (owner) ++owner->handles_out;
}

void let_go(kdn_client* client, Client* owner) noexcept {
  if (!owner || owner->handles_out == 0) return;
  if (--owner->handles_out > 0 || owner == client->c.get()) return;
  std::erase_if(client->retired, [&](const std::unique_ptr<Client>& r) { return r.get() == owner; });
}

bool reconnect_if_needed(kdn_client* client) noexcept {
  if (!client || !client->c) return false;
  if (!client->c->broken()) return true;
  const uint64_t now = now_ns();
  if (client->last_attempt_ns != 0 && now - client->last_attempt_ns < kReconnectIntervalNs) return false;
  client->last_attempt_ns = now;
  try {
    kdn_connect_opts o = client->opts;
    o.socket_path = client->socket_path.empty() ? nullptr : client->socket_path.c_str();
    o.name_space = client->name_space.empty() ? nullptr : client->name_space.c_str();
    o.token = client->token.empty() ? nullptr : client->token.c_str();
    auto fresh = Client::connect(&o, client->hello_flags);
    if (!fresh.ok()) return false;
    Client& c = **fresh;
    std::vector<uint32_t> ids;
    for (const auto& m : client->c->models) {
      auto id = register_on(c, m->info);
      if (!id.ok()) return false;  // e.g. the model table is full: stay down, try again later
      ids.push_back(*id);
    }
    for (size_t i = 0; i < ids.size(); ++i) client->c->models[i]->id = ids[i];
    c.models = std::move(client->c->models);
    client->c->models.clear();
    std::unique_ptr<Client> old = std::move(client->c);
    client->c = std::move(*fresh);
    if (old->handles_out > 0) client->retired.push_back(std::move(old));
    ++client->reconnects;
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace kdn::shim
