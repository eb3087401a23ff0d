// Handle types behind the opaque C structs, and helpers shared by the API files.
#pragma once

#include "client.h"

#include <kdn/kdn.h>

#include <new>
#include <vector>

struct kdn_client {
  std::unique_ptr<kdn::shim::Client> c;
};

struct kdn_lease {
  const kdn_model* model = nullptr;
  std::vector<const void*> data;
  std::vector<uint64_t> ids;
};

struct kdn_store {
  const kdn_model* model = nullptr;
  std::vector<void*> data;            // null where no write is needed
  std::vector<uint64_t> reservation;  // 0 where no write is needed
};

struct kdn_op {
  enum class Kind : uint8_t { kLookup, kCommit } kind = Kind::kLookup;
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

// Argument checks common to every per-model call (KDN_OK or an error code).
int check_model_call(kdn_client* client, const kdn_model* model, const int32_t* tokens, size_t n);
Client& client_of(kdn_client* c);

// A request whose input is the prefix keys of chunks [first, first + count) of `tokens`
// (count clipped to the whole chunks available) and whose output holds `out_record` bytes
// per key. Allocates payload; the caller frees r.in and r.out.
Result<uint32_t> build_key_request(Client& c, const kdn_model& m, const int32_t* tokens, size_t n,
                                   uint32_t first, uint32_t count, uint32_t out_record, Request& r);

}  // namespace kdn::shim
