// Handle types behind the opaque C structs, and helpers shared by the API files.
#pragma once

#include "client.h"

#include <kdn/kdn.h>

#include <new>
#include <string>
#include <vector>

// A connection and what it takes to make it again: after kdnd went away, a later call
// reconnects (at most once per kReconnectIntervalNs), presenting the same namespace and token
// and registering the same models again (their kdn_model handles stay valid; their ids change).
struct kdn_client {
  std::unique_ptr<kdn::shim::Client> c;
  // How to connect again (the strings the options pointed to are copies).
  kdn_connect_opts opts{};
  std::string socket_path, name_space, token;
  uint32_t hello_flags = 0;
  uint64_t last_attempt_ns = 0;
  uint64_t reconnects = 0;
  // Connections replaced after a restart that still have handles out (see Client::handles_out).
  std::vector<std::unique_ptr<kdn::shim::Client>> retired;
};

struct kdn_lease {
  kdn::shim::Client* owner = nullptr;  // the connection it was made on
  const kdn_model* model = nullptr;
  std::vector<const void*> data;
  std::vector<uint64_t> ids;
};

struct kdn_store {
  kdn::shim::Client* owner = nullptr;
  const kdn_model* model = nullptr;
  std::vector<void*> data;            // null where no write is needed
  std::vector<uint64_t> reservation;  // 0 where no write is needed
};

struct kdn_op {
  enum class Kind : uint8_t { kLookup, kCommit } kind = Kind::kLookup;
  kdn::shim::Client* owner = nullptr;
  uint64_t user_data = 0;
  kdn::shim::PayloadRange in, out;
  bool complete = false;
  int status = KDN_ERR_IN_PROGRESS;
  kdn_lookup_result lookup{};
  uint32_t chunk_tokens = 0;
  uint32_t keys = 0;  // keys (or reservation ids) sent, to check the answer against
};

namespace kdn::shim {

inline int rc(const Status& s) { return s.raw(); }

// Runs an API body; allocation failure and any stray exception become status codes, so
// nothing is thrown across the C ABI.
template <class F>
int guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return KDN_ERR_NO_MEMORY;
  } catch (...) {
    return KDN_ERR_INTERNAL;
  }
}

// Argument checks common to every per-model call (KDN_OK or an error code). A connection
// kdnd closed is made again first when it is time to try (reconnect below).
int check_model_call(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n);
Client& client_of(kdn_client* c);

// At most one reconnection attempt per this long.
constexpr uint64_t kReconnectIntervalNs = 200'000'000;
// True when the client has a working connection: the current one, or a new one made now
// because kdnd closed the last (rate-limited; registers the client's models again).
bool reconnect_if_needed(kdn_client* client) noexcept;
// Registers `info` on `c`; its daemon id.
Result<uint32_t> register_on(Client& c, const ModelInfo& info);
// A handle was made on, or let go of, the connection `owner`. Letting go of the last handle of
// a replaced connection unmaps it.
void hold(kdn_client* client, Client* owner) noexcept;
void let_go(kdn_client* client, Client* owner) noexcept;

// A request whose input is the prefix keys of chunks [first, first + count) of `tokens`
// (count clipped to the whole chunks available) and whose output holds `out_record` bytes
// per key. Allocates payload; the caller frees r.in and r.out. A RESERVE (r.sqe.opcode set
// before the call) also says where its keys sit in their prefix chain, for kdnctl ls.
Result<uint32_t> build_key_request(Client& c, const kdn_model& m, const int32_t* tokens, size_t n, uint32_t first,
                                   uint32_t count, uint32_t out_record, Request& r);

}  // namespace kdn::shim
