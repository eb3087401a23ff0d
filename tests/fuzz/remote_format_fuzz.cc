// libFuzzer harness for T3's remote values and key names (docs/remote.md): what a GET brings
// back from a store that anyone may have written to.
//
// Input: the first byte picks the path and what the harness seals; the rest is a value (header
// then payload) or a key name. The header's and the payload's CRC32C are ones random bytes
// almost never match, so by default the harness writes the magic, the format major and minor
// and both CRCs itself, and may also make the sizes agree with the value's length and the
// expectation agree with the header: the fuzzer then reaches every field check behind them,
// which is where a stale or foreign value that happens to be well sealed must still be refused.
//
// What must hold: every refusal says why; a header that decodes keeps the invariants a reader
// relies on and encodes back to exactly its bytes; a value that decodes names exactly the chunk,
// model and namespace asked for, its payload is the rest of the value and matches its CRC;
// a key name that parses is made again, byte for byte, from its parts.
#include "remote_format.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace kdn::sidecar::remote;

void require(bool ok) {
  if (!ok) std::abort();
}

bool same(const kdn_key& a, const kdn_key& b) { return a.lo == b.lo && a.hi == b.hi; }

void seal_header(std::byte* b) {
  const uint32_t crc = crc32c(b, kHeaderCrcAt);
  std::memcpy(b + kHeaderCrcAt, &crc, 4);
}

void key_name(std::string_view text) {
  auto parts = parse_value_key(text);
  if (!parts) return;
  require(valid_namespace(parts->name_space));
  require(value_key(parts->name_space, parts->fingerprint, parts->key) == text);
  require(text.find('{') == std::string_view::npos);  // never a hash tag
}

void value(std::vector<std::byte>& v, uint8_t pick) {
  const bool seal = (pick & 0x80) == 0;
  const bool seal_payload = (pick & 0x40) != 0;
  const bool match = (pick & 0x20) != 0;
  const bool sizes = (pick & 0x10) != 0;
  if (seal) {
    if (v.size() < kHeaderBytes) v.resize(kHeaderBytes);
    std::memcpy(v.data(), "KDNVALUE", 8);
    std::memcpy(v.data() + 8, &kFormatMajor, 2);
    std::memcpy(v.data() + 10, &kFormatMinor, 2);  // any minor is read; this one encodes back the same
    if (sizes) {
      const uint16_t header = kHeaderBytes;
      const uint64_t stored = v.size() - kHeaderBytes;
      std::memcpy(v.data() + 12, &header, 2);
      std::memcpy(v.data() + 56, &stored, 8);
      if (v[14] == std::byte{0}) std::memcpy(v.data() + 48, &stored, 8);  // codec none: raw == stored
    }
    if (seal_payload) {
      const uint32_t crc = crc32c(v.data() + kHeaderBytes, v.size() - kHeaderBytes);
      std::memcpy(v.data() + 64, &crc, 4);
    }
    seal_header(v.data());
  }
  if (v.size() < kHeaderBytes) return;

  ValueHeader h;
  const kdn::Status st = decode_header(std::span<const std::byte, kHeaderBytes>(v.data(), kHeaderBytes), &h);
  if (!st.ok()) {
    require(st.what() != nullptr && *st.what() != 0);
    return;
  }
  require(h.raw_bytes > 0 && h.raw_bytes <= kMaxRawBytes);
  require(h.stored_bytes > 0 && h.stored_bytes <= kMaxRawBytes);
  require(uint8_t(h.codec) <= kMaxRemoteCodec);
  require(h.codec != RemoteCodec::kNone || h.stored_bytes == h.raw_bytes);
  require(h.codec == RemoteCodec::kNone || h.stored_bytes < h.raw_bytes);
  require(valid_namespace(h.name_space));
  uint16_t minor;
  std::memcpy(&minor, v.data() + 10, 2);
  if (minor == kFormatMinor) {
    std::array<std::byte, kHeaderBytes> again{};
    encode_header(h, again.data());
    require(std::memcmp(again.data(), v.data(), kHeaderBytes) == 0);
  }

  const kdn_key other_key{1, 2}, other_model{3, 4};
  ValueExpectation want{"default", other_key, other_model};
  if (match) want = ValueExpectation{h.name_space, h.key, h.fingerprint};
  ValueHeader got;
  std::span<const std::byte> payload;
  const kdn::Status vs = decode_value(v, want, &got, &payload);
  if (!vs.ok()) {
    require(vs.what() != nullptr && *vs.what() != 0);
    return;
  }
  require(same(got.key, want.key) && same(got.fingerprint, want.fingerprint) && got.name_space == want.name_space);
  require(payload.data() == v.data() + kHeaderBytes && payload.size() == got.stored_bytes);
  require(payload.size() + kHeaderBytes == v.size());
  require(crc32c(payload.data(), payload.size()) == got.payload_crc);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t pick = data[0];
  if ((pick & 3) == 3) {
    key_name(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
    return 0;
  }
  std::vector<std::byte> v(size - 1);
  if (size > 1) std::memcpy(v.data(), data + 1, size - 1);
  value(v, pick);
  return 0;
}
