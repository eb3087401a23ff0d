// libFuzzer harness for the handshake messages: any bytes as a HelloMsg (what kdnd reads from
// a client) and as a welcome or refusal (what libkdn reads from a daemon). Every input must
// get a verdict; what is accepted must satisfy the documented invariants.
#include <kdn/ipc/handshake.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

namespace {

void require(bool ok) {
  if (!ok) std::abort();  // an accepted message broke an invariant: a finding
}

kdn::ipc::HelloMsg a_hello() {
  kdn::ipc::HelloRequest r;
  r.name_space = "default";
  r.ring_entries = 64;
  r.payload_bytes = 1 << 20;
  r.staging_bytes = 1 << 20;
  r.flags = kdn::ipc::kHelloFlagAdmin;
  return *kdn::ipc::make_hello(r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kdn::ipc;
  const auto bytes = std::as_bytes(std::span(data, size));
  HelloMsg h;
  if (parse_hello(bytes, &h).ok()) {
    require(size == sizeof(HelloMsg));
    require(std::memchr(h.name_space, 0, sizeof h.name_space) != nullptr);
    require(std::memchr(h.token, 0, sizeof h.token) != nullptr);
    require(SessionLayout::compute(h.ring_entries, h.payload_bytes).ok());
    require(h.staging_bytes % kPageBytes == 0 && h.client_pid != 0);
  }
  // The same bytes as the daemon's answer, with every plausible descriptor count.
  const HelloMsg asked = a_hello();
  for (size_t fds = 0; fds <= kMaxWelcomeFds; ++fds) {
    WelcomeMsg w;
    if (!parse_welcome(bytes, fds, asked, &w).ok()) continue;
    require(size == sizeof(WelcomeMsg) && w.status == KDN_OK);
    require(fds == kWelcomeFdFirstRegion + w.num_regions && w.num_regions >= 1);
    require((w.flags & ~asked.flags) == 0);
    auto layout = SessionLayout::compute(w.ring_entries, w.payload_bytes);
    require(layout.ok() && w.session_segment_bytes == layout->total_bytes);
    for (uint32_t i = 0; i < w.num_regions; ++i) require(w.regions[i].region_id != 0 && w.regions[i].bytes != 0);
  }
  return 0;
}
