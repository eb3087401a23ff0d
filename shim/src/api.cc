// The C ABI of libkdn (kdn/kdn.h) over kdn::shim::Client. Every entry point validates its
// arguments, never throws (allocation failure becomes KDN_ERR_NO_MEMORY) and returns a
// kdn_status.
#include "client.h"
#include "handles.h"

#include <kdn/common/model.h>
#include <kdn/ipc/payload.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>

using kdn::Code;
using kdn::Status;
using kdn::shim::Client;
using kdn::shim::guarded;
using kdn::shim::PayloadRange;
using kdn::shim::rc;
using kdn::shim::Request;

namespace {

// A working connection, made again first if kdnd closed the last one and it is time to try.
bool usable(kdn_client* cl) { return kdn::shim::reconnect_if_needed(cl); }

bool own_model(kdn_client* cl, const kdn_model* m) {
  for (auto& p : cl->c->models)
    if (p.get() == m) return true;
  return false;
}

}  // namespace

extern "C" {

KDN_API const char* kdn_strerror(int status) { return kdn::code_name(static_cast<Code>(status)); }
KDN_API uint32_t kdn_abi_version(void) { return KDN_ABI_VERSION; }
KDN_API uint32_t kdn_abi_minor(void) { return KDN_ABI_MINOR; }

KDN_API uint64_t kdn_chunk_bytes(const kdn_model_desc* desc) {
  if (!desc) return 0;
  auto m = kdn::ModelInfo::from_desc(*desc);
  return m.ok() ? m->chunk_bytes : 0;
}

KDN_API int kdn_model_validate(const kdn_model_desc* desc) {
  if (!desc) return KDN_ERR_INVALID_ARGUMENT;
  return rc(kdn::ModelInfo::from_desc(*desc).status());
}

KDN_API int kdn_model_fingerprint(const kdn_model_desc* desc, kdn_key* out) {
  if (!desc || !out) return KDN_ERR_INVALID_ARGUMENT;
  auto m = kdn::ModelInfo::from_desc(*desc);
  if (!m.ok()) return rc(m.status());
  *out = m->fingerprint;
  return KDN_OK;
}

KDN_API int kdn_prefix_keys(const kdn_model_desc* desc, const int32_t* tokens, size_t n_tokens, kdn_key* keys,
                            size_t max_keys, size_t* n_keys) {
  if (!desc || (!tokens && n_tokens) || (!keys && max_keys) || !n_keys) return KDN_ERR_INVALID_ARGUMENT;
  auto m = kdn::ModelInfo::from_desc(*desc);
  if (!m.ok()) return rc(m.status());
  *n_keys = kdn::prefix_keys(*m, {tokens, n_tokens}, {keys, max_keys});
  return KDN_OK;
}

KDN_API int kdn_connect(const kdn_connect_opts* opts, kdn_client** out) {
  if (!out) return KDN_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return guarded([&]() -> int {
    auto c = Client::connect(opts, 0);
    if (!c.ok()) return rc(c.status());
    auto cl = std::make_unique<kdn_client>();
    cl->c = std::move(*c);
    if (opts) {  // what a reconnection presents again
      cl->opts = *opts;
      if (opts->socket_path) cl->socket_path = opts->socket_path;
      if (opts->name_space) cl->name_space = opts->name_space;
      if (opts->token) cl->token = opts->token;
    } else {
      cl->opts.struct_size = sizeof(kdn_connect_opts);
    }
    *out = cl.release();
    return KDN_OK;
  });
}

KDN_API void kdn_disconnect(kdn_client* client) { delete client; }

KDN_API int kdn_ping(kdn_client* client) {
  if (!usable(client)) return client ? KDN_ERR_UNAVAILABLE : KDN_ERR_INVALID_ARGUMENT;
  return guarded([&]() -> int {
    using Op = kdn::ipc::PingOp;
    const Op::Args args{0x6b646e};
    Request r;
    r.sqe.opcode = uint8_t(Op::kOpcode);
    Op::put(args, r.sqe);
    auto c = client->c->call(r);
    if (!c.ok()) return rc(c.status());
    if (c->status != KDN_OK) return int(c->status);
    return rc(Op::result(*c, args).status());
  });
}

KDN_API int kdn_get_session_info(kdn_client* client, kdn_session_info* out) {
  // Callers built before ABI minor 5 pass the struct without max_lease_bytes.
  constexpr uint32_t kBeforeMinor5 = offsetof(kdn_session_info, max_lease_bytes);
  if (!client || !client->c || !out) return KDN_ERR_INVALID_ARGUMENT;
  const uint32_t size = out->struct_size;
  if (size != sizeof(kdn_session_info) && size != kBeforeMinor5) return KDN_ERR_INVALID_ARGUMENT;
  const kdn::ipc::WelcomeMsg& w = client->c->welcome();
  kdn_session_info info{};
  info.struct_size = size;
  info.admin = (w.flags & kdn::ipc::kHelloFlagAdmin) != 0;
  info.staging_bytes = client->c->staging_bytes();
  info.arena_bytes = client->c->arena_bytes();
  info.max_leases = w.limits.max_leases;
  info.max_lease_count = w.limits.max_lease_count;
  info.max_reservations = w.limits.max_reservations;
  info.max_in_flight = w.limits.max_in_flight;
  info.max_models = w.limits.max_models;
  info.reservation_timeout_ms = w.limits.reservation_timeout_ms;
  info.max_lease_bytes = w.limits.max_lease_bytes;  // 0 from a kdnd before protocol minor 6
  std::memcpy(out, &info, size);
  return KDN_OK;
}

KDN_API int kdn_register_model(kdn_client* client, const kdn_model_desc* desc, kdn_model** out) {
  if (!client || !desc || !out) return KDN_ERR_INVALID_ARGUMENT;
  if (!usable(client)) return KDN_ERR_UNAVAILABLE;
  *out = nullptr;
  return guarded([&]() -> int {
    auto info = kdn::ModelInfo::from_desc(*desc);
    if (!info.ok()) return rc(info.status());
    Client& c = *client->c;
    auto id = kdn::shim::register_on(c, *info);
    if (!id.ok()) return rc(id.status());
    auto m = std::make_unique<kdn_model>();
    m->id = *id;
    m->info = std::move(*info);
    *out = m.get();
    c.models.push_back(std::move(m));
    return KDN_OK;
  });
}

KDN_API uint64_t kdn_model_chunk_bytes(const kdn_model* m) { return m ? m->info.chunk_bytes : 0; }
KDN_API uint32_t kdn_model_chunk_tokens(const kdn_model* m) { return m ? m->info.chunk_tokens : 0; }

KDN_API uint32_t kdn_store_max_chunks(kdn_client* client, const kdn_model* model) {
  if (!client || !client->c || !model) return 0;
  const uint64_t slot = (model->info.chunk_bytes + 4095) / 4096 * 4096;
  const uint64_t by_staging = slot ? client->c->staging_bytes() / slot : 0;
  const uint64_t by_limit = client->c->welcome().limits.max_reservations;
  return uint32_t(std::min<uint64_t>({by_staging, by_limit, kdn::ipc::kMaxKeysPerOp}));
}

}  // extern "C"

namespace kdn::shim {

int check_model_call(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n) {
  if (!client || !model || (!tokens && n)) return KDN_ERR_INVALID_ARGUMENT;
  if (!client->c) return KDN_ERR_INVALID_ARGUMENT;
  if (!reconnect_if_needed(client)) return KDN_ERR_UNAVAILABLE;
  if (!own_model(client, model)) return KDN_ERR_INVALID_ARGUMENT;
  return KDN_OK;
}

Client& client_of(kdn_client* c) { return *c->c; }

}  // namespace kdn::shim
