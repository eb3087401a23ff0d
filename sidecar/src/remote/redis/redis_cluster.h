// Redis Cluster's documented client rules, as pure functions and one table: which of the 16384
// hash slots a key lives in, who serves each slot (from a CLUSTER SLOTS reply), and what a
// MOVED or ASK redirect says. No I/O here; RedisCluster (redis_conn.h) acts on them.
//
//   - key_slot(): CRC16 (XMODEM: poly 0x1021, init 0, no reflection) of the key mod 16384; when
//     the key has a "{...}" with at least one byte between the first '{' and the next '}',
//     only those bytes are hashed (a hash tag), so related keys share a slot;
//   - CLUSTER SLOTS: an array of [start, end, master, replica...], each node [host, port, id,
//     ...]; an empty host ("" or "?") means "the address you reached me at";
//   - "MOVED <slot> <host>:<port>": the slot now lives there for good (update the map);
//     "ASK <slot> <host>:<port>": ask there once, preceded by ASKING (do not update the map).
//
// Thread safety: SlotMap is a value; const use from any thread.
#pragma once

#include "resp.h"

#include <kdn/common/status.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kdn::sidecar {

inline constexpr uint32_t kClusterSlots = 16384;

uint16_t crc16_xmodem(std::string_view bytes) noexcept;
// The slot of `key`, hash tags honoured.
uint16_t key_slot(std::string_view key) noexcept;

struct NodeAddress {
  std::string host;  // numeric IPv4 or IPv6 address (or "localhost")
  uint16_t port = 0;
  bool operator==(const NodeAddress&) const = default;
  std::string to_string() const;
};

// "host:port" (the last ':' separates the port, so "::1:6379" works); nullopt if malformed.
std::optional<NodeAddress> parse_address(std::string_view text);

struct Redirect {
  enum class Kind : uint8_t { kMoved, kAsk } kind = Kind::kMoved;
  uint16_t slot = 0;
  NodeAddress node;
};

// The redirect an error reply's text carries ("MOVED 3999 127.0.0.1:6381"); nullopt for any
// other error or a malformed redirect.
std::optional<Redirect> parse_redirect(std::string_view error_text);

// Which master serves each slot.
class SlotMap {
 public:
  static constexpr uint16_t kNoOwner = UINT16_MAX;

  // Every slot served by `node` (standalone Redis).
  static SlotMap single(NodeAddress node);
  // From a CLUSTER SLOTS reply; `reached` stands in for a node whose host is empty or "?".
  // kProtocol when the reply is not shaped as documented (an error reply: kUnavailable,
  // e.g. "ERR This instance has cluster support disabled").
  static Result<SlotMap> from_cluster_slots(const resp::Reply& reply, const NodeAddress& reached);

  // The master of `slot` as an index into masters(), or kNoOwner where no range covers it.
  uint16_t owner(uint16_t slot) const noexcept { return owner_[slot]; }
  const std::vector<NodeAddress>& masters() const noexcept { return masters_; }
  // Slots no range covers.
  uint32_t uncovered() const noexcept;
  // `slot` moved to `node` (a MOVED redirect); adds the node if it is new.
  void assign(uint16_t slot, const NodeAddress& node);

 private:
  uint16_t index_of(const NodeAddress& node);
  std::vector<NodeAddress> masters_;
  std::vector<uint16_t> owner_ = std::vector<uint16_t>(kClusterSlots, kNoOwner);
};

}  // namespace kdn::sidecar
