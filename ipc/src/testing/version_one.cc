#include "testing/version_one.h"

#include <kdn/ipc/protocol.h>
#include <kdn/ipc/uds.h>

#include <unistd.h>

#include <cstring>

namespace kdn::ipc::testing {

std::vector<std::byte> version_one_hello() {
  std::vector<std::byte> v1(152, std::byte{0});
  const uint32_t magic = kHelloMagic;
  const uint16_t major = 1;
  const uint32_t pid = uint32_t(::getpid());
  std::memcpy(v1.data(), &magic, 4);
  std::memcpy(v1.data() + 4, &major, 2);
  std::memcpy(v1.data() + 8, "default", 7);
  std::memcpy(v1.data() + 144, &pid, 4);
  return v1;
}

Result<RefusalSeen> read_refusal(int sock, uint32_t timeout_ms) {
  std::byte buf[256];
  auto msg = recv_message(sock, buf, 4, timeout_ms);
  if (!msg.ok()) return msg.status();
  RefusalSeen r;
  r.bytes = msg->bytes;
  r.fds = msg->num_fds;
  if (r.bytes >= 10) {
    std::memcpy(&r.status, buf + 4, 4);
    std::memcpy(&r.proto_major, buf + 8, 2);
  }
  return r;
}

}  // namespace kdn::ipc::testing
