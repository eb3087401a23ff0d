#include "remote_format.h"

#include "disk_format.h"
#include "record_bytes.h"

#include <kdn/common/model.h>
#include <kdn/kernels/crc32c.h>

#include <algorithm>
#include <cstring>

namespace kdn::sidecar::remote {
namespace {

// The codec ids are T2's: a chunk keeps its encoding between the tiers. (Only the header's
// constants are used: this library does not link the disk tier.)
static_assert(uint8_t(RemoteCodec::kNone) == uint8_t(disk::DiskCodec::kNone));
static_assert(uint8_t(RemoteCodec::kLossless) == uint8_t(disk::DiskCodec::kLossless));
static_assert(uint8_t(RemoteCodec::kInt8) == uint8_t(disk::DiskCodec::kInt8));
static_assert(uint8_t(RemoteCodec::kKivi4) == uint8_t(disk::DiskCodec::kKivi4));
static_assert(kMaxRemoteCodec == disk::kMaxDiskCodec);

constexpr char kMagic[8] = {'K', 'D', 'N', 'V', 'A', 'L', 'U', 'E'};

// Header offsets (docs/remote.md draws them).
constexpr size_t kAtMajor = 8, kAtMinor = 10, kAtHeaderBytes = 12, kAtCodec = 14, kAtFlags = 15;
constexpr size_t kAtKey = 16, kAtFingerprint = 32, kAtRawBytes = 48, kAtStoredBytes = 56;
constexpr size_t kAtPayloadCrc = 64, kAtReserved1 = 68, kAtRawHash = 72, kAtName = 88;
constexpr size_t kAtWritten = 152, kAtReserved2 = 160;
static_assert(kAtName + kNameBytes == kAtWritten && kAtReserved2 < kHeaderCrcAt);

using record::get;
using record::put;
using record::zero_range;

// A NUL-terminated valid namespace followed by zeros, or false.
bool get_name(const std::byte* b, std::string* out) noexcept {
  return record::get_name(b, kAtName, kNameBytes, out) && valid_namespace(*out);
}

bool parse_hex64(std::string_view s, uint64_t* out) noexcept {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | uint64_t(d);
  }
  *out = v;
  return true;
}

bool parse_key_hex(std::string_view s, kdn_key* out) noexcept {
  return s.size() == 32 && parse_hex64(s.substr(0, 16), &out->hi) && parse_hex64(s.substr(16), &out->lo);
}

}  // namespace

const char* remote_codec_name(RemoteCodec c) noexcept {
  switch (c) {
    case RemoteCodec::kNone:
      return "none";
    case RemoteCodec::kLossless:
      return "lossless";
    case RemoteCodec::kInt8:
      return "int8";
    case RemoteCodec::kKivi4:
      return "kivi4";
  }
  return "unknown";
}

bool parse_remote_codec(std::string_view name, RemoteCodec* out) noexcept {
  for (uint8_t c = 0; c <= kMaxRemoteCodec; ++c) {
    if (name == remote_codec_name(RemoteCodec(c))) {
      *out = RemoteCodec(c);
      return true;
    }
  }
  return false;
}

bool valid_namespace(std::string_view name) noexcept {
  if (name.empty() || name.size() >= kNameBytes || name.front() == '.') return false;
  for (char c : name) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

uint32_t crc32c(const void* data, size_t n) noexcept { return kernels::kvc1::crc32c(data, n); }

// ---- keys ----------------------------------------------------------------------------------------

std::string key_hex(const kdn_key& k) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[size_t(15 - i)] = kDigits[(k.hi >> (4 * i)) & 15];
    s[size_t(31 - i)] = kDigits[(k.lo >> (4 * i)) & 15];
  }
  return s;
}

std::string value_key(std::string_view name_space, const kdn_key& fingerprint, const kdn_key& key) {
  std::string s;
  s.reserve(kKeyPrefix.size() + name_space.size() + 67);
  s.append(kKeyPrefix).append(":").append(name_space).append(":");
  s.append(key_hex(fingerprint)).append(":").append(key_hex(key));
  return s;
}

std::optional<KeyParts> parse_value_key(std::string_view text) {
  // The tail is fixed-width (":<32>:<32>"), so the namespace is whatever lies before it.
  constexpr size_t kTail = 1 + 32 + 1 + 32;
  const size_t head = kKeyPrefix.size() + 1;
  if (text.size() < head + 1 + kTail || text.substr(0, kKeyPrefix.size()) != kKeyPrefix || text[head - 1] != ':')
    return std::nullopt;
  std::string_view ns = text.substr(head, text.size() - head - kTail);
  std::string_view tail = text.substr(text.size() - kTail);
  KeyParts p;
  if (!valid_namespace(ns) || tail[0] != ':' || tail[33] != ':' || !parse_key_hex(tail.substr(1, 32), &p.fingerprint) ||
      !parse_key_hex(tail.substr(34), &p.key))
    return std::nullopt;
  p.name_space = std::string(ns);
  return p;
}

// ---- header --------------------------------------------------------------------------------------

void encode_header(const ValueHeader& h, std::byte* b) noexcept {
  std::memset(b, 0, kHeaderBytes);
  std::memcpy(b, kMagic, sizeof kMagic);
  put<uint16_t>(b, kAtMajor, kFormatMajor);
  put<uint16_t>(b, kAtMinor, kFormatMinor);
  put<uint16_t>(b, kAtHeaderBytes, uint16_t(kHeaderBytes));
  put<uint8_t>(b, kAtCodec, uint8_t(h.codec));
  put<kdn_key>(b, kAtKey, h.key);
  put<kdn_key>(b, kAtFingerprint, h.fingerprint);
  put<uint64_t>(b, kAtRawBytes, h.raw_bytes);
  put<uint64_t>(b, kAtStoredBytes, h.stored_bytes);
  put<uint32_t>(b, kAtPayloadCrc, h.payload_crc);
  put<kdn_key>(b, kAtRawHash, h.raw_hash);
  record::put_name(b, kAtName, kNameBytes, h.name_space);
  put<uint64_t>(b, kAtWritten, h.written_unix_ns);
  put<uint32_t>(b, kHeaderCrcAt, crc32c(b, kHeaderCrcAt));
}

Status decode_header(std::span<const std::byte, kHeaderBytes> in, ValueHeader* out) noexcept {
  const std::byte* b = in.data();
  if (std::memcmp(b, kMagic, sizeof kMagic) != 0)
    return Status(Code::kCorrupt, "remote value: not a kdn value (bad magic)");
  if (get<uint16_t>(b, kAtMajor) != kFormatMajor) return Status(Code::kVersion, "remote value of another format major");
  if (get<uint32_t>(b, kHeaderCrcAt) != crc32c(b, kHeaderCrcAt))
    return Status(Code::kCorrupt, "remote value: header CRC mismatch");
  if (get<uint16_t>(b, kAtHeaderBytes) != kHeaderBytes)
    return Status(Code::kCorrupt, "remote value: header size is not 192");
  if (get<uint8_t>(b, kAtFlags) != 0 || get<uint32_t>(b, kAtReserved1) != 0 ||
      !zero_range(b, kAtReserved2, kHeaderCrcAt))
    return Status(Code::kCorrupt, "remote value: reserved bytes are not zero");
  ValueHeader h;
  const uint8_t codec = get<uint8_t>(b, kAtCodec);
  if (codec > kMaxRemoteCodec) return Status(Code::kCorrupt, "remote value names an unknown codec");
  h.codec = RemoteCodec(codec);
  h.key = get<kdn_key>(b, kAtKey);
  h.fingerprint = get<kdn_key>(b, kAtFingerprint);
  h.raw_bytes = get<uint64_t>(b, kAtRawBytes);
  h.stored_bytes = get<uint64_t>(b, kAtStoredBytes);
  h.payload_crc = get<uint32_t>(b, kAtPayloadCrc);
  h.raw_hash = get<kdn_key>(b, kAtRawHash);
  h.written_unix_ns = get<uint64_t>(b, kAtWritten);
  if (!get_name(b, &h.name_space)) return Status(Code::kCorrupt, "remote value: namespace is not a name");
  if (h.raw_bytes == 0 || h.raw_bytes > kMaxRawBytes)
    return Status(Code::kCorrupt, "remote value: raw size is impossible");
  if (h.stored_bytes == 0 || h.stored_bytes > kMaxRawBytes)
    return Status(Code::kCorrupt, "remote value: stored size is impossible");
  if (h.codec == RemoteCodec::kNone && h.stored_bytes != h.raw_bytes)
    return Status(Code::kCorrupt, "remote value: an uncompressed value's stored size differs from its raw size");
  // A writer stores a chunk raw when its encoding does not shrink it: a reader can then size
  // the buffer an encoding lands in from the chunk alone.
  if (h.codec != RemoteCodec::kNone && h.stored_bytes >= h.raw_bytes)
    return Status(Code::kCorrupt, "remote value: a compressed value is not smaller than its chunk");
  if (h.codec != RemoteCodec::kLossless && !(h.raw_hash == kdn_key{}))
    return Status(Code::kCorrupt, "remote value: a raw hash without the lossless codec");
  *out = std::move(h);
  return OkStatus();
}

Status check_header(const ValueHeader& h, const ValueExpectation& want, uint64_t value_bytes) noexcept {
  // Another chunk under this name: a colliding key, or a stale overwrite by another model.
  if (!(h.key == want.key)) return Status(Code::kCorrupt, "remote value belongs to another chunk key");
  if (!(h.fingerprint == want.fingerprint)) return Status(Code::kCorrupt, "remote value belongs to another model");
  if (h.name_space != want.name_space) return Status(Code::kCorrupt, "remote value belongs to another namespace");
  if (value_bytes < kHeaderBytes || value_bytes - kHeaderBytes != h.stored_bytes)
    return Status(Code::kCorrupt, "remote value length disagrees with its header");
  return OkStatus();
}

Status decode_value(std::span<const std::byte> value, const ValueExpectation& want, ValueHeader* header,
                    std::span<const std::byte>* payload) noexcept {
  if (value.size() < kHeaderBytes) return Status(Code::kCorrupt, "remote value shorter than its header");
  ValueHeader h;
  KDN_RETURN_IF_ERROR(decode_header(value.first<kHeaderBytes>(), &h));
  KDN_RETURN_IF_ERROR(check_header(h, want, value.size()));
  std::span<const std::byte> body = value.subspan(kHeaderBytes);
  if (crc32c(body.data(), body.size()) != h.payload_crc)
    return Status(Code::kCorrupt, "remote value: payload CRC mismatch");
  *header = std::move(h);
  *payload = body;
  return OkStatus();
}

}  // namespace kdn::sidecar::remote
