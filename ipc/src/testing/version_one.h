// What a client of protocol version 1 sends and reads, for tests that check kdnd tells such a
// client the version instead of failing it some other way.
#pragma once

#include <kdn/common/status.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kdn::ipc::testing {

// A version-1 hello: 152 bytes, magic "KDNH", proto_major 1 at offset 4, namespace "default",
// this process's pid at offset 144.
std::vector<std::byte> version_one_hello();

struct RefusalSeen {
  size_t bytes = 0;  // message size
  size_t fds = 0;
  int32_t status = 0;        // at offset 4
  uint16_t proto_major = 0;  // at offset 8
};
// Reads the daemon's answer on `sock` the way a version-1 client reads its welcome's prefix.
Result<RefusalSeen> read_refusal(int sock, uint32_t timeout_ms);

}  // namespace kdn::ipc::testing
