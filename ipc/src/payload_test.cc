#include <kdn/ipc/payload.h>

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace kdn::ipc {
namespace {

constexpr uint32_t kArea = 1 << 20;

Sqe sqe_of(Opcode op) {
  Sqe s{};
  s.opcode = static_cast<uint8_t>(op);
  return s;
}

Code check(const Sqe& s, bool admin = false, uint32_t area = kArea) {
  return check_sqe(s, area, admin).status().code();
}

TEST(PayloadRef, OverflowSafeBounds) {
  EXPECT_TRUE(payload_ref_ok(0, 0, 0));
  EXPECT_TRUE(payload_ref_ok(0, kArea, kArea));
  EXPECT_TRUE(payload_ref_ok(kArea, 0, kArea));
  EXPECT_FALSE(payload_ref_ok(kArea + 1, 0, kArea));
  EXPECT_FALSE(payload_ref_ok(1, kArea, kArea));
  EXPECT_FALSE(payload_ref_ok(0xFFFFFFF0u, 0x20, kArea)) << "off + len wraps u32";
  EXPECT_FALSE(payload_ref_ok(0x10, 0xFFFFFFF8u, kArea)) << "off + len wraps u32";
  EXPECT_FALSE(payload_ref_ok(0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu));
  EXPECT_TRUE(range_ok(UINT64_MAX - 1, 1, UINT64_MAX));
  EXPECT_FALSE(range_ok(UINT64_MAX - 1, 2, UINT64_MAX));
  EXPECT_FALSE(range_ok(8, UINT64_MAX, 16));
}

TEST(CheckSqe, UnknownOpcodesAreUnsupported) {
  for (uint8_t op : {uint8_t{0}, uint8_t{15}, uint8_t{18}, uint8_t{kMaxOpcode + 1}, uint8_t{200}, uint8_t{255}}) {
    Sqe s{};
    s.opcode = op;
    EXPECT_EQ(check(s), Code::kUnsupported) << int(op);
    EXPECT_STREQ(opcode_name(op), "unknown");
  }
  EXPECT_STREQ(opcode_name(static_cast<uint8_t>(Opcode::kLease)), "LEASE");
}

TEST(CheckSqe, FlagsAndReservedBitsMustBeZero) {
  Sqe s = sqe_of(Opcode::kPing);
  EXPECT_EQ(check(s), Code::kOk);
  s.flags = 1;
  EXPECT_EQ(check(s), Code::kProtocol);
  s = sqe_of(Opcode::kPing);
  s.reserved = 1;
  EXPECT_EQ(check(s), Code::kProtocol);
}

TEST(CheckSqe, PayloadOnOpcodesWithoutIt) {
  Sqe s = sqe_of(Opcode::kPing);
  s.in_len = 16;
  EXPECT_EQ(check(s), Code::kProtocol);
  s = sqe_of(Opcode::kLookup);
  s.out_len = 16;
  EXPECT_EQ(check(s), Code::kProtocol);
}

TEST(CheckSqe, InputReferences) {
  Sqe s = sqe_of(Opcode::kLookup);
  s.in_off = 64;
  s.in_len = 16 * 10;
  auto shape = check_sqe(s, kArea, false);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->in_records, 10u);
  s.in_len = 16 * 10 + 3;
  EXPECT_EQ(check(s), Code::kProtocol) << "not whole keys";
  s.in_off = kArea - 16;
  s.in_len = 32;
  EXPECT_EQ(check(s), Code::kProtocol) << "beyond the area";
  s.in_off = 0xFFFFFFF0u;
  s.in_len = 0x20;
  EXPECT_EQ(check(s), Code::kProtocol) << "wraps u32";
  s.in_off = 0;
  s.in_len = 0;
  EXPECT_EQ(check(s), Code::kOk) << "zero keys is a valid (empty) lookup";
}

TEST(CheckSqe, AtMost65536Records) {
  constexpr uint32_t kBig = 64u << 20;
  Sqe s = sqe_of(Opcode::kLookup);
  s.in_len = 16 * kMaxKeysPerOp;
  EXPECT_EQ(check(s, false, kBig), Code::kOk);
  s.in_len = 16 * (kMaxKeysPerOp + 1);
  EXPECT_EQ(check(s, false, kBig), Code::kInvalidArgument);
  s = sqe_of(Opcode::kRelease);
  s.in_len = 8 * (kMaxKeysPerOp + 1);
  EXPECT_EQ(check(s, false, kBig), Code::kInvalidArgument);
}

TEST(CheckSqe, OutputMustHoldTheAnswer) {
  Sqe s = sqe_of(Opcode::kReserve);
  s.in_len = 16 * 4;
  s.out_off = 4096;
  s.out_len = sizeof(ReserveRecord) * 4;
  EXPECT_EQ(check(s), Code::kOk);
  s.out_len -= 1;
  EXPECT_EQ(check(s), Code::kInvalidArgument);
  s.out_len = sizeof(ReserveRecord) * 4;
  s.out_off = kArea - 8;
  EXPECT_EQ(check(s), Code::kProtocol);

  s = sqe_of(Opcode::kLease);
  s.in_len = 16 * 8;
  s.out_len = sizeof(LeaseRecord) * 3;
  EXPECT_EQ(check(s), Code::kInvalidArgument) << "no cap: room for all 8 needed";
  s.arg[0] = 3;
  EXPECT_EQ(check(s), Code::kOk) << "max 3 chunks: room for 3 is enough";

  s = sqe_of(Opcode::kStats);
  s.out_len = 7;
  EXPECT_EQ(check(s), Code::kInvalidArgument) << "not even one counter";
  s.out_len = sizeof(StatsRecord) + 100;
  auto shape = check_sqe(s, kArea, false);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->out_capacity, (sizeof(StatsRecord) + 100) / 8) << "counted in u64 words";
}

TEST(CheckSqe, SegmentOpsNeedARecordPerKey) {
  EXPECT_STREQ(opcode_name(static_cast<uint8_t>(Opcode::kLookupEach)), "LOOKUP_EACH");
  EXPECT_STREQ(opcode_name(static_cast<uint8_t>(Opcode::kLeaseEach)), "LEASE_EACH");
  Sqe s = sqe_of(Opcode::kLookupEach);
  s.in_len = 16 * 5;
  s.out_off = 4096;
  s.out_len = 5;  // one byte per key
  auto shape = check_sqe(s, kArea, false);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->in_records, 5u);
  EXPECT_EQ(shape->out_capacity, 5u);
  s.out_len = 4;
  EXPECT_EQ(check(s), Code::kInvalidArgument);
  s = sqe_of(Opcode::kLeaseEach);
  s.in_len = 16 * 8;
  s.out_off = 4096;
  s.out_len = sizeof(LeaseRecord) * 7;
  s.arg[0] = 3;  // LEASE_EACH has no cap: arg0 changes nothing
  EXPECT_EQ(check(s), Code::kInvalidArgument);
  s.out_len = sizeof(LeaseRecord) * 8;
  EXPECT_EQ(check(s), Code::kOk);
}

TEST(OpResults, LookupEachCountsMustMatchItsRecords) {
  const uint8_t rec[4] = {1, kTierMiss, 2, 1};
  Cqe c{};
  c.res[0] = 3;
  c.res[2] = 2;  // host
  c.res[3] = 1;  // disk
  auto r = LookupEachOp::result(c, rec, 4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->hit_chunks, 3u);
  EXPECT_EQ(r->tier_chunks[1], 2u);
  c.res[0] = 4;
  EXPECT_EQ(LookupEachOp::result(c, rec, 4).status().code(), Code::kProtocol);
  c.res[0] = 3;
  const uint8_t bad[4] = {1, 7, 2, 1};
  EXPECT_EQ(LookupEachOp::result(c, bad, 4).status().code(), Code::kProtocol);
  Cqe l{};
  l.res[0] = 5;
  EXPECT_EQ(LeaseEachOp::result(l, 4).status().code(), Code::kProtocol);
}

TEST(CheckSqe, RegisterModelTakesExactlyOneDescriptor) {
  Sqe s = sqe_of(Opcode::kRegisterModel);
  s.in_len = sizeof(ModelRecord);
  EXPECT_EQ(check(s), Code::kOk);
  s.in_len = 2 * sizeof(ModelRecord);
  EXPECT_EQ(check(s), Code::kProtocol);
  s.in_len = 0;
  EXPECT_EQ(check(s), Code::kProtocol);
}

TEST(CheckSqe, AdminOpcodes) {
  Sqe s = sqe_of(Opcode::kList);
  s.out_len = sizeof(ListRecord) * 10;
  EXPECT_EQ(check(s, false), Code::kPermission);
  auto shape = check_sqe(s, kArea, true);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->out_capacity, 10u);
  s.out_len = sizeof(ListRecord) - 1;
  EXPECT_EQ(check(s, true), Code::kInvalidArgument);

  s = sqe_of(Opcode::kEvict);
  EXPECT_EQ(check(s, false), Code::kPermission);
  EXPECT_EQ(check(s, true), Code::kOk) << "mode all, no keys";
  s.in_len = 32;
  EXPECT_EQ(check(s, true), Code::kInvalidArgument) << "mode all with keys";
  s.arg[0] = static_cast<uint64_t>(EvictMode::kByKeys);
  EXPECT_EQ(check(s, true), Code::kOk);
  s.arg[0] = 7;
  EXPECT_EQ(check(s, true), Code::kInvalidArgument);
}

TEST(CheckSqe, GpuOpShapes) {
  EXPECT_STREQ(opcode_name(uint8_t(Opcode::kGpuRegister)), "GPU_REGISTER");
  EXPECT_STREQ(opcode_name(uint8_t(Opcode::kGpuUnregister)), "GPU_UNREGISTER");
  EXPECT_STREQ(opcode_name(uint8_t(Opcode::kGpuRetrieve)), "GPU_RETRIEVE");
  EXPECT_STREQ(opcode_name(uint8_t(Opcode::kGpuStore)), "GPU_STORE");
  EXPECT_STREQ(opcode_name(uint8_t(Opcode::kGpuInfo)), "GPU_INFO");
  // GPU_REGISTER: exactly one descriptor in, room for the answer out.
  Sqe s = sqe_of(Opcode::kGpuRegister);
  EXPECT_EQ(check(s), Code::kProtocol);  // no descriptor
  s.in_len = sizeof(GpuRegisterRecord);
  EXPECT_EQ(check(s), Code::kInvalidArgument);  // no room for the answer
  s.out_off = 4096;
  s.out_len = sizeof(GpuRegisteredRecord);
  EXPECT_EQ(check(s), Code::kOk);
  s.in_len = 2 * sizeof(GpuRegisterRecord);
  EXPECT_EQ(check(s), Code::kProtocol);
  s.in_len = sizeof(GpuRegisterRecord) - 1;
  EXPECT_EQ(check(s), Code::kProtocol);
  // GPU_UNREGISTER takes no payload.
  s = sqe_of(Opcode::kGpuUnregister);
  EXPECT_EQ(check(s), Code::kOk);
  s.in_len = 16;
  EXPECT_EQ(check(s), Code::kProtocol);
  // GPU_RETRIEVE / GPU_STORE: keys in, no output (the layout is referenced by arg2).
  for (Opcode op : {Opcode::kGpuRetrieve, Opcode::kGpuStore}) {
    s = sqe_of(op);
    s.in_len = 3 * sizeof(kdn_key);
    EXPECT_EQ(check(s), Code::kOk);
    s.out_len = 32;
    EXPECT_EQ(check(s), Code::kProtocol) << "no output area";
    s.out_len = 0;
    s.in_len = 17;
    EXPECT_EQ(check(s), Code::kProtocol);
  }
  // GPU_INFO: at least one device record of room.
  s = sqe_of(Opcode::kGpuInfo);
  EXPECT_EQ(check(s), Code::kInvalidArgument);
  s.out_len = sizeof(GpuDeviceRecord);
  EXPECT_EQ(check(s), Code::kOk);
}

TEST(OpResults, GpuAnswersAreChecked) {
  Cqe c{};
  EXPECT_FALSE(GpuRegisterOp::result(c).ok());  // registration 0
  c.res[0] = 3;
  c.res[1] = 1;
  c.res[2] = 0;
  ASSERT_TRUE(GpuRegisterOp::result(c).ok());
  EXPECT_EQ(GpuRegisterOp::result(c)->registration, 3u);
  c.res[2] = kGpuMaxDevices;
  EXPECT_FALSE(GpuRegisterOp::result(c).ok());
  Cqe r{};
  r.res[0] = 5;
  r.res[1] = 2;
  EXPECT_TRUE(GpuRetrieveOp::result(r, 5).ok());
  EXPECT_FALSE(GpuRetrieveOp::result(r, 4).ok());
  r.res[1] = 6;
  EXPECT_FALSE(GpuRetrieveOp::result(r, 8).ok());
  Cqe st{};
  st.res[0] = 2;
  st.res[1] = 2;
  EXPECT_TRUE(GpuStoreOp::result(st, 4).ok());
  EXPECT_FALSE(GpuStoreOp::result(st, 3).ok());
  const GpuRegistrationRef ref{7, 9};
  EXPECT_EQ(GpuRegistrationRef::of(ref.word()).registration, 7u);
  EXPECT_EQ(GpuRegistrationRef::of(ref.word()).generation, 9u);
  const GpuLayoutRef lay{4096, 1234};
  EXPECT_EQ(GpuLayoutRef::of(lay.word()).off, 4096u);
  EXPECT_EQ(GpuLayoutRef::of(lay.word()).len, 1234u);
}

TEST(PayloadArea, CopiesAreBoundsChecked) {
  std::vector<std::byte> mem(4096);
  PayloadArea area(mem.data(), 4096);
  std::byte buf[16] = {};
  EXPECT_TRUE(area.copy_in(4096 - 16, buf).ok());
  EXPECT_EQ(area.copy_in(4096 - 15, buf).code(), Code::kProtocol);
  EXPECT_EQ(area.copy_in(0xFFFFFFFFu, buf).code(), Code::kProtocol);
  EXPECT_TRUE(area.copy_out(0, buf).ok());
  EXPECT_EQ(area.copy_out(4090, buf).code(), Code::kProtocol);
  std::vector<std::byte> huge(8192);
  EXPECT_EQ(area.copy_in(0, huge).code(), Code::kProtocol);
}

TEST(PayloadArea, RecordsAreCopiedIntoPrivateMemory) {
  std::vector<std::byte> mem(4096);
  PayloadArea area(mem.data(), 4096);
  kdn_key keys[3] = {{1, 2}, {3, 4}, {5, 6}};
  std::memcpy(mem.data() + 128, keys, sizeof(keys));
  Sqe s = sqe_of(Opcode::kLookup);
  s.in_off = 128;
  s.in_len = sizeof(keys);
  kdn_key scratch[8];
  auto got = area.copy_in_records<kdn_key>(s, scratch);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 3u);
  std::memset(mem.data() + 128, 0xEE, sizeof(keys));  // the client scribbles afterwards
  EXPECT_EQ((*got)[2].lo, 5u) << "the daemon's copy is unaffected";
  kdn_key tiny[2];
  EXPECT_EQ(area.copy_in_records<kdn_key>(s, tiny).status().code(), Code::kInvalidArgument);
  s.in_len = 20;
  EXPECT_EQ(area.copy_in_records<kdn_key>(s, scratch).status().code(), Code::kProtocol);

  Sqe r = sqe_of(Opcode::kLease);
  r.out_off = 1024;
  r.out_len = sizeof(LeaseRecord) * 2;
  LeaseRecord slots[3] = {{{1, 1, 4096}, 1, 1, 0}, {{1, 1, 8192}, 2, 1, 0}, {{1, 1, 0}, 3, 1, 0}};
  EXPECT_TRUE(area.copy_out_records<LeaseRecord>(r, std::span(slots, 2)).ok());
  EXPECT_EQ(area.copy_out_records<LeaseRecord>(r, slots).code(), Code::kInvalidArgument);
  LeaseRecord back;
  std::memcpy(&back, mem.data() + 1024 + sizeof(LeaseRecord), sizeof(back));
  EXPECT_EQ(back.lease_id, 2u);
  // Slices: the second record alone, then zeroing what was not served.
  EXPECT_TRUE(area.copy_out_slice<LeaseRecord>(r, 1, std::span(slots + 2, 1)).ok());
  std::memcpy(&back, mem.data() + 1024 + sizeof(LeaseRecord), sizeof(back));
  EXPECT_EQ(back.lease_id, 3u);
  EXPECT_EQ(area.copy_out_slice<LeaseRecord>(r, 2, std::span(slots, 1)).code(), Code::kInvalidArgument);
  EXPECT_TRUE(area.zero_out_records<LeaseRecord>(r, 1, 2).ok());
  std::memcpy(&back, mem.data() + 1024 + sizeof(LeaseRecord), sizeof(back));
  EXPECT_EQ(back.lease_id, 0u);
  EXPECT_EQ(area.zero_out_records<LeaseRecord>(r, 1, 3).code(), Code::kInvalidArgument);
  std::memcpy(mem.data() + 128, keys, sizeof(keys));
  s.in_len = sizeof(keys);
  kdn_key one;
  EXPECT_TRUE(area.copy_in_slice(s, 2, std::span(&one, 1)).ok());
  EXPECT_EQ(one.lo, 5u);
  EXPECT_EQ(area.copy_in_slice(s, 3, std::span(&one, 1)).code(), Code::kProtocol) << "past the input";
}

TEST(SessionLayout, SectionsArePageAlignedAndOrdered) {
  auto l = SessionLayout::compute(256, 1 << 20);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->sq_offset, 4096u);
  EXPECT_EQ(l->cq_offset % 4096, 0u);
  EXPECT_GE(l->cq_offset, l->sq_offset + ring_region_bytes(256, sizeof(Sqe)));
  EXPECT_GE(l->payload_offset, l->cq_offset + ring_region_bytes(256, sizeof(Cqe)));
  EXPECT_EQ(l->total_bytes, l->payload_offset + (1u << 20));
  EXPECT_FALSE(SessionLayout::compute(256, 5000).ok());
  EXPECT_FALSE(SessionLayout::compute(300, 1 << 20).ok());
}

TEST(SessionHeader, ClientChecksEveryField) {
  auto l = SessionLayout::compute(64, 64 << 10);
  ASSERT_TRUE(l.ok());
  SessionHeader h{};
  init_session_header(h, *l, 77);
  EXPECT_TRUE(check_session_header(h, *l, 77).ok());
  EXPECT_EQ(check_session_header(h, *l, 78).code(), Code::kProtocol);
  SessionHeader bad = h;
  bad.payload_offset += 8;
  EXPECT_EQ(check_session_header(bad, *l, 77).code(), Code::kProtocol);
  bad = h;
  bad.magic = 0;
  EXPECT_EQ(check_session_header(bad, *l, 77).code(), Code::kProtocol);
}

namespace kdn::ipc {
namespace {

// Random SQEs against a small area: check_sqe never accepts a reference outside the area,
// and a copy_in of whatever it accepts stays inside (ASan would see a stray read).
TEST(CheckSqeMutation, AcceptedReferencesStayInsideTheArea) {
  constexpr uint32_t kSmall = 64 << 10;
  std::vector<std::byte> mem(kSmall);
  PayloadArea area(mem.data(), kSmall);
  std::vector<kdn_key> scratch(kMaxKeysPerOp);
  std::mt19937_64 rng(5);
  int accepted = 0;
  for (int round = 0; round < 500'000; ++round) {
    Sqe s{};
    s.opcode = static_cast<uint8_t>(1 + rng() % (kMaxOpcode + 1));
    // Mostly plausible numbers, sometimes huge ones near the u32 wrap.
    auto pick = [&]() -> uint32_t { return rng() % 4 == 0 ? static_cast<uint32_t>(rng()) : rng() % (kSmall + 64); };
    s.in_off = pick();
    s.in_len = rng() % 3 == 0 ? 0 : pick() & ~15u;
    s.out_off = pick();
    s.out_len = pick();
    s.arg[0] = rng() % 3;
    bool admin = rng() % 2 == 0;
    auto shape = check_sqe(s, kSmall, admin);
    if (!shape.ok()) continue;
    ++accepted;
    ASSERT_TRUE(shape->shape->in_record == 0 || payload_ref_ok(s.in_off, s.in_len, kSmall));
    ASSERT_TRUE(shape->shape->out_record == 0 || payload_ref_ok(s.out_off, s.out_len, kSmall));
    ASSERT_LE(shape->in_records, kMaxKeysPerOp);
    if (shape->shape->in_record == sizeof(kdn_key)) {
      ASSERT_TRUE(area.copy_in_records<kdn_key>(s, scratch).ok());
    }
  }
  EXPECT_GT(accepted, 1000);
}

}  // namespace
}  // namespace kdn::ipc

TEST(CheckSqe, GpuSegmentRetrieveShape) {
  EXPECT_STREQ(opcode_name(uint8_t(Opcode::kGpuSegmentRetrieve)), "GPU_SEGMENT_RETRIEVE");
  EXPECT_EQ(uint8_t(Opcode::kGpuSegmentRetrieve), 26);
  // Keys in, one byte of room per key out.
  Sqe s = sqe_of(Opcode::kGpuSegmentRetrieve);
  s.in_len = 3 * sizeof(kdn_key);
  EXPECT_EQ(check(s), Code::kInvalidArgument) << "no room for the chunk bytes";
  s.out_off = 4096;
  s.out_len = 2;
  EXPECT_EQ(check(s), Code::kInvalidArgument);
  s.out_len = 3;
  EXPECT_EQ(check(s), Code::kOk);
  s.in_len = 17;
  EXPECT_EQ(check(s), Code::kProtocol);
}

TEST(OpResults, GpuSegmentRetrieveArgsRoundTrip) {
  Sqe s{};
  GpuSegmentRetrieveOp::put({7, {3, 9}, {128, 48}, {4096, 1000}}, s);
  const auto a = GpuSegmentRetrieveOp::args(s);
  EXPECT_EQ(a.model_id, 7u);
  EXPECT_EQ(a.reg.registration, 3u);
  EXPECT_EQ(a.reg.generation, 9u);
  EXPECT_EQ(a.chunks.off, 128u);
  EXPECT_EQ(a.chunks.len, 48u);
  EXPECT_EQ(a.layout.off, 4096u);
  EXPECT_EQ(a.layout.len, 1000u);
}

TEST(OpResults, GpuSegmentRetrieveAnswersAreChecked) {
  const uint8_t out[4] = {kGpuSegmentLoaded, kGpuSegmentSkipped, kGpuSegmentLoaded, kGpuSegmentSkipped};
  Cqe c{};
  c.res[0] = 2;
  c.res[1] = 1;
  ASSERT_TRUE(GpuSegmentRetrieveOp::result(c, out, 4).ok());
  EXPECT_EQ(GpuSegmentRetrieveOp::result(c, out, 4)->loaded, 2u);
  c.res[0] = 3;  // disagrees with the bytes
  EXPECT_FALSE(GpuSegmentRetrieveOp::result(c, out, 4).ok());
  c.res[0] = 2;
  c.res[1] = 3;  // more from T0 than loaded
  EXPECT_FALSE(GpuSegmentRetrieveOp::result(c, out, 4).ok());
  c.res[1] = 0;
  const uint8_t bad[2] = {kGpuSegmentLoaded, 7};
  c.res[0] = 1;
  EXPECT_FALSE(GpuSegmentRetrieveOp::result(c, bad, 2).ok());
  c.res[0] = 5;
  EXPECT_FALSE(GpuSegmentRetrieveOp::result(c, out, 4).ok());
}

TEST(OpResults, GpuSegmentChunkRecordsAreChecked) {
  using Op = GpuSegmentRetrieveOp;
  std::vector<GpuSegmentChunkRecord> r = {{100, 0, kGpuSegmentStart}, {-100, 16, 0}};
  EXPECT_TRUE(Op::check_chunks(r, 2, 16, 32).ok());
  EXPECT_EQ(Op::check_chunks(r, 3, 16, 32).code(), Code::kInvalidArgument);  // one record per key
  EXPECT_EQ(Op::check_chunks(r, 2, 16, 31).code(), Code::kInvalidArgument);  // second chunk leaves the layout
  r[1].first_token = UINT32_MAX;                                             // no wrap-around
  EXPECT_EQ(Op::check_chunks(r, 2, 16, 32).code(), Code::kInvalidArgument);
  r[1].first_token = 16;
  r[1].delta = KDN_MAX_POSITION;
  EXPECT_TRUE(Op::check_chunks(r, 2, 16, 32).ok());
  r[1].delta = -KDN_MAX_POSITION - 1;
  EXPECT_EQ(Op::check_chunks(r, 2, 16, 32).code(), Code::kInvalidArgument);
  r[1].delta = INT64_MIN;
  EXPECT_EQ(Op::check_chunks(r, 2, 16, 32).code(), Code::kInvalidArgument);
  r[1].delta = 0;
  r[1].flags = 2;
  EXPECT_EQ(Op::check_chunks(r, 2, 16, 32).code(), Code::kInvalidArgument);
}

TEST(CheckSqe, GpuBlendSelectShape) {
  EXPECT_STREQ(opcode_name(uint8_t(Opcode::kGpuBlendSelect)), "GPU_BLEND_SELECT");
  EXPECT_EQ(uint8_t(Opcode::kGpuBlendSelect), 14);
  // Keys in, room for at least one int32 index out.
  Sqe s = sqe_of(Opcode::kGpuBlendSelect);
  s.in_len = 3 * sizeof(kdn_key);
  EXPECT_EQ(check(s), Code::kInvalidArgument) << "no room for an index";
  s.out_off = 4096;
  s.out_len = 4;
  EXPECT_EQ(check(s), Code::kOk);
  s.in_len = 17;
  EXPECT_EQ(check(s), Code::kProtocol);
}

TEST(OpResults, GpuBlendSelectArgsRoundTripAndAreChecked) {
  using Op = GpuBlendSelectOp;
  Sqe s{};
  Op::put({7, {3, 9}, {128, 48}, {4096, 1000}, 29, kGpuBlendPlaneV, 150000}, s);
  const auto a = Op::args(s);
  EXPECT_EQ(a.model_id, 7u);
  EXPECT_EQ(a.reg.registration, 3u);
  EXPECT_EQ(a.reg.generation, 9u);
  EXPECT_EQ(a.chunks.off, 128u);
  EXPECT_EQ(a.chunks.len, 48u);
  EXPECT_EQ(a.layout.off, 4096u);
  EXPECT_EQ(a.layout.len, 1000u);
  EXPECT_EQ(a.check_layer, 29u);
  EXPECT_EQ(a.plane, kGpuBlendPlaneV);
  EXPECT_EQ(a.ratio_ppm, 150000u);
  EXPECT_TRUE(Op::check_args(s, 30).ok());
  EXPECT_EQ(Op::check_args(s, 29).code(), Code::kInvalidArgument);  // layer 29 of 29
  Sqe bad = s;
  bad.arg[3] |= 1ull << 20;  // an undefined bit
  EXPECT_EQ(Op::check_args(bad, 30).code(), Code::kInvalidArgument);
  bad = s;
  bad.arg[3] = (bad.arg[3] & ~(3ull << 16)) | (2ull << 16);  // plane 2
  EXPECT_EQ(Op::check_args(bad, 30).code(), Code::kInvalidArgument);
  bad = s;
  bad.arg[3] = (bad.arg[3] & 0xffffffffull) | (uint64_t(kGpuBlendRatioOne + 1) << 32);
  EXPECT_EQ(Op::check_args(bad, 30).code(), Code::kInvalidArgument);
}

TEST(OpResults, GpuBlendSelectAnswersAreChecked) {
  using Op = GpuBlendSelectOp;
  const int32_t out[3] = {2, 17, 40};
  Cqe c{};
  c.res[0] = 3;   // selected
  c.res[1] = 50;  // compared
  c.res[2] = 4;   // chunks
  c.res[3] = 1;   // from T0
  auto r = Op::result(c, out, 3, 4, 64);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->selected, 3u);
  EXPECT_EQ(r->candidates, 50u);
  EXPECT_FALSE(Op::result(c, out, 2, 4, 64).ok());  // more than the room
  EXPECT_FALSE(Op::result(c, out, 3, 3, 64).ok());  // more chunks than keys
  EXPECT_FALSE(Op::result(c, out, 3, 4, 40).ok());  // index 40 outside 40 tokens
  const int32_t unordered[3] = {2, 40, 17};
  EXPECT_FALSE(Op::result(c, unordered, 3, 4, 64).ok());
  const int32_t negative[3] = {-1, 17, 40};
  EXPECT_FALSE(Op::result(c, negative, 3, 4, 64).ok());
  c.res[1] = 2;  // fewer compared than selected
  EXPECT_FALSE(Op::result(c, out, 3, 4, 64).ok());
  c.res[1] = 50;
  c.res[3] = 5;  // more from T0 than compared chunks
  EXPECT_FALSE(Op::result(c, out, 3, 4, 64).ok());
}

TEST(OpResults, GpuCheckArgsRoundTripAndRetrieveTicketsAreChecked) {
  Sqe s{};
  GpuCheckOp::put({{3, 9}, 17, 42}, s);
  s.opcode = uint8_t(Opcode::kGpuCheck);
  EXPECT_EQ(check(s), Code::kOk);
  EXPECT_STREQ(opcode_name(s.opcode), "GPU_CHECK");
  const auto a = GpuCheckOp::args(s);
  EXPECT_EQ(a.reg.registration, 3u);
  EXPECT_EQ(a.reg.generation, 9u);
  EXPECT_EQ(a.first, 17u);
  EXPECT_EQ(a.last, 42u);
  s.in_len = 8;  // no payload
  EXPECT_EQ(check(s), Code::kProtocol);

  Cqe c{};
  GpuRetrieveOp::put({2, 1, 77}, c);
  auto r = GpuRetrieveOp::result(c, 4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ticket, 77u);
  GpuRetrieveOp::put({0, 0, 77}, c);  // a ticket for no copy
  EXPECT_FALSE(GpuRetrieveOp::result(c, 4).ok());
  GpuRetrieveOp::put({0, 0, 0}, c);
  EXPECT_TRUE(GpuRetrieveOp::result(c, 4).ok());
  const uint8_t none[2] = {kGpuSegmentSkipped, kGpuSegmentSkipped};
  GpuSegmentRetrieveOp::put({0, 0, 5}, c);
  EXPECT_FALSE(GpuSegmentRetrieveOp::result(c, none, 2).ok());
  const uint8_t one[2] = {kGpuSegmentLoaded, kGpuSegmentSkipped};
  GpuSegmentRetrieveOp::put({1, 0, 5}, c);
  auto sr = GpuSegmentRetrieveOp::result(c, one, 2);
  ASSERT_TRUE(sr.ok());
  EXPECT_EQ(sr->ticket, 5u);
}

TEST(OpResults, GpuPrefetchShapeArgsAndAnswers) {
  Sqe s = sqe_of(Opcode::kGpuPrefetch);
  s.in_len = 3 * sizeof(kdn_key);
  EXPECT_EQ(check(s), Code::kOk);
  EXPECT_STREQ(opcode_name(s.opcode), "GPU_PREFETCH");
  s.out_off = 4096;
  s.out_len = 8;
  EXPECT_EQ(check(s), Code::kProtocol) << "no output";
  GpuPrefetchOp::put({7, {3, 9}, 2}, s);
  const auto a = GpuPrefetchOp::args(s);
  EXPECT_EQ(a.model_id, 7u);
  EXPECT_EQ(a.reg.registration, 3u);
  EXPECT_EQ(a.reg.generation, 9u);
  EXPECT_EQ(GpuPrefetchOp::wanted(a, 5), 2u);
  EXPECT_EQ(GpuPrefetchOp::wanted({7, {3, 9}, 0}, 5), 5u);
  Cqe c{};
  GpuPrefetchOp::put({4, 3, 1}, c);
  auto r = GpuPrefetchOp::result(c, 4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->queued, 3u);
  EXPECT_EQ(r->resident, 1u);
  EXPECT_FALSE(GpuPrefetchOp::result(c, 3).ok());  // more found than asked
  GpuPrefetchOp::put({4, 3, 2}, c);                // queued + resident > found
  EXPECT_FALSE(GpuPrefetchOp::result(c, 4).ok());
}

}  // namespace
}  // namespace kdn::ipc
