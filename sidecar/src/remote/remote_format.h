// The bytes T3 keeps in Redis: how a chunk's key is named, and the value stored under it (a
// fixed header, then the payload). docs/remote.md documents every byte; this file is the one
// place that reads or writes them.
//
// Key:   kdn:<namespace>:<fingerprint, 32 hex digits>:<chunk key, 32 hex digits>
//        No "{hash tag}": every chunk hashes to its own slot, so a document's chunks spread
//        over every master of a cluster. Namespace names (letters, digits, '.', '_', '-') can
//        hold neither a brace nor a colon, so the name is unambiguous and never tagged.
// Value: [0, 192) header, little-endian, sealed by a CRC32C of its first 188 bytes
//        [192, 192 + stored_bytes) payload: the canonical chunk (codec none) or its KVC1 encoding
//
// A value is untrusted input: another node, an older kdn, an operator or a stale overwrite may
// have put anything under a key. A reader accepts a value only when the header is intact, it
// names exactly the key, fingerprint and namespace asked for, its sizes agree with the value's
// length, and the payload matches its CRC32C. Anything else is kCorrupt (kVersion for another
// format major): a miss, never served.
//
// Thread safety: pure functions; any thread.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kdn.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace kdn::sidecar::remote {

static_assert(std::endian::native == std::endian::little, "remote values are little-endian");

constexpr uint16_t kFormatMajor = 1;  // a reader refuses other majors
constexpr uint16_t kFormatMinor = 0;  // informational: a later minor gives reserved bytes meaning
constexpr size_t kHeaderBytes = 192;  // the payload starts here
constexpr size_t kHeaderCrcAt = kHeaderBytes - 4;
constexpr size_t kNameBytes = 64;  // a namespace name, NUL-padded (at most 63 bytes)
constexpr std::string_view kKeyPrefix = "kdn";

// What the payload is. The ids are the disk tier's (disk::DiskCodec), so a chunk moves between
// T2 and T3 without re-encoding.
enum class RemoteCodec : uint8_t {
  kNone = 0,      // the canonical chunk itself
  kLossless = 1,  // KVC1 lossless; raw_hash is the chunk's XXH3-128
  kInt8 = 2,      // KVC1 int8 (lossy)
  kKivi4 = 3,     // KVC1 kivi4 (lossy)
};
constexpr uint8_t kMaxRemoteCodec = 3;
const char* remote_codec_name(RemoteCodec c) noexcept;  // "none", "lossless", "int8", "kivi4"
// The codec remote_codec_name() names; false for any other text.
bool parse_remote_codec(std::string_view name, RemoteCodec* out) noexcept;

// True for a name kdn accepts as a namespace (the configuration's rule).
bool valid_namespace(std::string_view name) noexcept;

// ---- keys ----------------------------------------------------------------------------------------

// "kdn:<ns>:<fingerprint>:<key>"; `name_space` must be valid_namespace().
std::string value_key(std::string_view name_space, const kdn_key& fingerprint, const kdn_key& key);
// A kdn_key as 32 lowercase hex digits, high half first.
std::string key_hex(const kdn_key& k);

struct KeyParts {
  std::string name_space;
  kdn_key fingerprint{};
  kdn_key key{};
};
// The parts of a name value_key() made; nullopt for anything else.
std::optional<KeyParts> parse_value_key(std::string_view text);

// ---- values --------------------------------------------------------------------------------------

struct ValueHeader {
  kdn_key key{};
  kdn_key fingerprint{};  // the model's
  RemoteCodec codec = RemoteCodec::kNone;
  uint64_t raw_bytes = 0;     // the canonical chunk's size
  uint64_t stored_bytes = 0;  // the payload's size (== raw_bytes for kNone, < it otherwise)
  uint32_t payload_crc = 0;   // CRC32C of the payload
  kdn_key raw_hash{};         // kLossless: XXH3-128 of the canonical chunk; zero otherwise
  std::string name_space;
  uint64_t written_unix_ns = 0;  // informational
};

// Writes kHeaderBytes at `out`.
void encode_header(const ValueHeader& h, std::byte* out) noexcept;
// Reads and validates a header on its own (magic, major, CRC, reserved bytes, sizes, codec).
Status decode_header(std::span<const std::byte, kHeaderBytes> in, ValueHeader* out) noexcept;

// What a reader asked for.
struct ValueExpectation {
  std::string_view name_space;
  kdn_key key{};
  kdn_key fingerprint{};
};
// A decoded header against the expectation and the value's total length (header + payload):
// another key, fingerprint or namespace, or a length that disagrees, is kCorrupt.
Status check_header(const ValueHeader& h, const ValueExpectation& want, uint64_t value_bytes) noexcept;

// The whole check of a value held in one buffer: header, expectation, length, payload CRC.
// On success *payload is the value's payload.
Status decode_value(std::span<const std::byte> value, const ValueExpectation& want, ValueHeader* header,
                    std::span<const std::byte>* payload) noexcept;

// CRC32C (the same as T2's and KVC1's).
uint32_t crc32c(const void* data, size_t n) noexcept;

// Largest raw chunk a value may carry (Redis' default proto-max-bulk-len is 512 MiB).
constexpr uint64_t kMaxRawBytes = (512ull << 20) - kHeaderBytes;

}  // namespace kdn::sidecar::remote
