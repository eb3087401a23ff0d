#include "remote_format.h"
#include "redis_cluster.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace kdn::sidecar::remote {
namespace {

constexpr kdn_key kKey{0x0123456789abcdefull, 0xfedcba9876543210ull};
constexpr kdn_key kModel{0x1111222233334444ull, 0x5555666677778888ull};

// A value of `raw` bytes of payload, as a writer makes it.
std::vector<std::byte> make_value(const std::string& ns, const kdn_key& key, const kdn_key& fp, size_t raw) {
  std::vector<std::byte> v(kHeaderBytes + raw);
  for (size_t i = 0; i < raw; ++i) v[kHeaderBytes + i] = std::byte(i * 31 + 7);
  ValueHeader h;
  h.key = key;
  h.fingerprint = fp;
  h.raw_bytes = h.stored_bytes = raw;
  h.payload_crc = crc32c(v.data() + kHeaderBytes, raw);
  h.name_space = ns;
  h.written_unix_ns = 42;
  encode_header(h, v.data());
  return v;
}

// Re-seals a header after a test changed a field.
void reseal(std::vector<std::byte>& v) {
  uint32_t crc = crc32c(v.data(), kHeaderCrcAt);
  std::memcpy(v.data() + kHeaderCrcAt, &crc, 4);
}

Status decode(const std::vector<std::byte>& v, const ValueExpectation& want) {
  ValueHeader h;
  std::span<const std::byte> payload;
  return decode_value(v, want, &h, &payload);
}

TEST(RemoteFormat, KeysNameNamespaceFingerprintAndChunk) {
  const std::string k = value_key("team-a", kModel, kKey);
  EXPECT_EQ(k, "kdn:team-a:55556666777788881111222233334444:fedcba98765432100123456789abcdef");
  auto parts = parse_value_key(k);
  ASSERT_TRUE(parts);
  EXPECT_EQ(parts->name_space, "team-a");
  EXPECT_TRUE(parts->fingerprint.lo == kModel.lo && parts->fingerprint.hi == kModel.hi);
  EXPECT_TRUE(parts->key.lo == kKey.lo && parts->key.hi == kKey.hi);
  // Not ours: a wrong prefix, a short digit string, upper case, a namespace with a brace.
  EXPECT_FALSE(parse_value_key("kdx" + k.substr(3)));
  EXPECT_FALSE(parse_value_key(k.substr(0, k.size() - 1)));
  EXPECT_FALSE(parse_value_key("kdn:team-a:55556666777788881111222233334444:FEDCBA98765432100123456789ABCDEF"));
  EXPECT_FALSE(parse_value_key("kdn:{a}:55556666777788881111222233334444:fedcba98765432100123456789abcdef"));
  EXPECT_FALSE(parse_value_key("kdn::55556666777788881111222233334444:fedcba98765432100123456789abcdef"));
  EXPECT_FALSE(valid_namespace("{tag}"));
  EXPECT_FALSE(valid_namespace("a:b"));
  EXPECT_FALSE(valid_namespace(std::string(64, 'n')));
}

TEST(RemoteFormat, ChunksSpreadOverSlots) {
  // No hash tag: consecutive chunks of one document land on many slots.
  std::set<uint16_t> slots;
  for (uint64_t i = 0; i < 64; ++i) slots.insert(key_slot(value_key("default", kModel, kdn_key{i, 0})));
  EXPECT_GT(slots.size(), 60u);
}

TEST(RemoteFormat, RoundTrip) {
  auto v = make_value("default", kKey, kModel, 5000);
  ValueHeader h;
  std::span<const std::byte> payload;
  ASSERT_TRUE(decode_value(v, {"default", kKey, kModel}, &h, &payload).ok());
  EXPECT_EQ(payload.size(), 5000u);
  EXPECT_EQ(payload.data(), v.data() + kHeaderBytes);
  EXPECT_EQ(h.raw_bytes, 5000u);
  EXPECT_EQ(h.codec, RemoteCodec::kNone);
  EXPECT_EQ(h.name_space, "default");
  EXPECT_EQ(h.written_unix_ns, 42u);
  std::vector<std::byte> again(kHeaderBytes);
  encode_header(h, again.data());
  EXPECT_EQ(std::memcmp(again.data(), v.data(), kHeaderBytes), 0);
}

TEST(RemoteFormat, ValuesOfAnotherChunkModelOrNamespaceAreCorrupt) {
  auto v = make_value("default", kKey, kModel, 4096);
  const kdn_key other{kKey.lo ^ 1, kKey.hi};
  EXPECT_EQ(decode(v, {"default", other, kModel}).code(), Code::kCorrupt);
  EXPECT_STREQ(decode(v, {"default", other, kModel}).what(), "remote value belongs to another chunk key");
  EXPECT_STREQ(decode(v, {"default", kKey, other}).what(), "remote value belongs to another model");
  EXPECT_STREQ(decode(v, {"tenant", kKey, kModel}).what(), "remote value belongs to another namespace");
}

TEST(RemoteFormat, DamageIsRefusedWithItsCause) {
  const ValueExpectation want{"default", kKey, kModel};
  auto good = make_value("default", kKey, kModel, 4096);
  auto expect = [&](std::vector<std::byte> v, Code code, const char* what) {
    Status st = decode(v, want);
    EXPECT_EQ(st.code(), code) << what;
    EXPECT_STREQ(st.what(), what);
  };
  auto v = good;
  v[kHeaderBytes + 100] ^= std::byte{1};
  expect(v, Code::kCorrupt, "remote value: payload CRC mismatch");
  v = good;
  v[20] ^= std::byte{1};
  expect(v, Code::kCorrupt, "remote value: header CRC mismatch");
  v = good;
  v[0] = std::byte{'X'};
  expect(v, Code::kCorrupt, "remote value: not a kdn value (bad magic)");
  v = good;
  v[8] = std::byte{2};
  expect(v, Code::kVersion, "remote value of another format major");
  v = good;
  v.pop_back();
  expect(v, Code::kCorrupt, "remote value length disagrees with its header");
  expect(std::vector<std::byte>(100), Code::kCorrupt, "remote value shorter than its header");
  v = good;
  v[170] = std::byte{1};
  reseal(v);
  expect(v, Code::kCorrupt, "remote value: reserved bytes are not zero");
  v = good;
  v[14] = std::byte{9};
  reseal(v);
  expect(v, Code::kCorrupt, "remote value names an unknown codec");
  v = good;
  v[56] = std::byte{1};  // stored != raw without a codec
  reseal(v);
  expect(v, Code::kCorrupt, "remote value: an uncompressed value's stored size differs from its raw size");
  v = good;
  v[14] = std::byte{3};  // kivi4, yet as large as the chunk
  reseal(v);
  expect(v, Code::kCorrupt, "remote value: a compressed value is not smaller than its chunk");
  v = good;
  v[88] = std::byte{'{'};
  reseal(v);
  expect(v, Code::kCorrupt, "remote value: namespace is not a name");
  v = good;
  v[72] = std::byte{1};
  reseal(v);
  expect(v, Code::kCorrupt, "remote value: a raw hash without the lossless codec");
}

}  // namespace
}  // namespace kdn::sidecar::remote
