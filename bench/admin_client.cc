#include "admin_client.h"

#include <kdn/ipc/handshake.h>
#include <kdn/ipc/ops.h>
#include <kdn/ipc/uds.h>

#include <cstring>

namespace kdn::bench {

AdminClient::AdminClient(const std::string& socket, const std::string& ns) {
  auto fd = ipc::uds_connect(socket, 5000);
  if (!fd.ok()) return;
  sock_ = std::move(*fd);
  ipc::HelloRequest req;
  req.name_space = ns;
  req.payload_bytes = 1 << 20;
  req.flags = ipc::kHelloFlagAdmin;
  auto hello = ipc::make_hello(req);
  if (!hello.ok()) return;
  auto hs = ipc::client_handshake(sock_.get(), *hello, 5000);
  if (!hs.ok()) return;
  auto cs = ipc::ClientSession::attach(std::move(*hs));
  if (!cs.ok()) return;
  s_ = std::move(*cs);
  ok_ = (s_.welcome().flags & ipc::kHelloFlagAdmin) != 0;
}

int AdminClient::call(ipc::Sqe q, ipc::Cqe* out) {
  q.user_data = next_ud_++;
  auto n = s_.submit(std::span<const ipc::Sqe>(&q, 1));
  if (!n.ok() || *n != 1) return KDN_ERR_PROTOCOL;
  for (;;) {
    ipc::Cqe c;
    auto r = s_.reap(std::span<ipc::Cqe>(&c, 1));
    if (!r.ok()) return r.status().raw();
    if (*r == 1) {
      *out = c;
      return c.user_data == q.user_data ? c.status : int(KDN_ERR_PROTOCOL);
    }
    Status st = s_.wait_for_completion(60'000'000'000);
    if (!st.ok()) return st.raw();
  }
}

bool AdminClient::demote_all() {
  ipc::Sqe q{};
  q.opcode = uint8_t(ipc::Opcode::kEvict);
  ipc::EvictOp::put({ipc::EvictMode::kHost}, q);
  ipc::Cqe c{};
  return ok_ && call(q, &c) == KDN_OK;
}

bool AdminClient::evict_all() {
  ipc::Sqe q{};
  q.opcode = uint8_t(ipc::Opcode::kEvict);
  ipc::EvictOp::put({ipc::EvictMode::kAll}, q);
  ipc::Cqe c{};
  return ok_ && call(q, &c) == KDN_OK;
}

int AdminClient::evict(ipc::EvictMode mode, const kdn_key* keys, size_t n_keys, uint64_t* evicted) {
  if (!ok_) return KDN_ERR_UNAVAILABLE;
  if (mode != ipc::EvictMode::kByKeys) n_keys = 0;
  if (n_keys > 4096) return KDN_ERR_INVALID_ARGUMENT;  // 64 KiB of the 1 MiB payload area
  ipc::Sqe q{};
  q.opcode = uint8_t(ipc::Opcode::kEvict);
  ipc::EvictOp::put({mode}, q);
  if (n_keys > 0) {
    std::memcpy(s_.payload(), keys, n_keys * sizeof(kdn_key));
    q.in_off = 0;
    q.in_len = uint32_t(n_keys * sizeof(kdn_key));
  }
  ipc::Cqe c{};
  const int st = call(q, &c);
  if (st == KDN_OK && evicted != nullptr) *evicted = c.res[0];
  return st;
}

std::optional<ipc::TierStatsRecord> AdminClient::tier_stats(ipc::ChunkTier t) {
  if (!ok_) return std::nullopt;
  ipc::Sqe q{};
  q.opcode = uint8_t(ipc::Opcode::kTierStats);
  q.out_off = 0;
  q.out_len = ipc::kTierCount * sizeof(ipc::TierStatsRecord);
  ipc::Cqe c{};
  if (call(q, &c) != KDN_OK || c.res[0] <= uint32_t(t)) return std::nullopt;
  ipc::TierStatsRecord r;
  std::memcpy(&r, s_.payload() + uint32_t(t) * sizeof(ipc::TierStatsRecord), sizeof r);
  if (!r.present) return std::nullopt;
  return r;
}

}  // namespace kdn::bench
