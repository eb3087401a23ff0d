// The integrity measurement (baselines.h): what a tamper-evident chunk costs under staging
// (a store is two copies) and under verify on read (hashing fused with the copies).
#include "baselines.h"

#include "page_buffer.h"

#include <kdn/kernels/stream_copy.h>

#include <xxhash.h>
// The x86 build of libxxhash picks its SSE2, AVX2 or AVX512 loop at run time through the
// *_dispatch entry points; this header points XXH3_128bits and XXH3_128bits_update at them.
// Without it, XXH3 runs the library's baseline (SSE2) loop.
#if __has_include(<xxh_x86dispatch.h>) && defined(__x86_64__)
#include <xxh_x86dispatch.h>
#define KDN_BENCH_XXH3_DISPATCH 1
#else
#define KDN_BENCH_XXH3_DISPATCH 0
#endif

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

namespace kdn::bench {
namespace {

using kernels::detail::copy_bytes;
using kernels::detail::streaming_fence;

struct HashStateDeleter {
  void operator()(XXH3_state_t* state) const noexcept { XXH3_freeState(state); }
};
using HashState = std::unique_ptr<XXH3_state_t, HashStateDeleter>;

struct LaneBuffers {
  PageBuffer src, staging, dst;
};

// One thread's chunks: src, staging and dst hold `chunks` chunks each, back to back.
class IntegrityLane final : public Lane {
 public:
  IntegrityLane(LaneBuffers buffers, HashState state, const IntegrityOptions& o, uint64_t seed)
      : b_(std::move(buffers)),
        state_(std::move(state)),
        chunk_(o.chunk_bytes),
        block_(o.block_bytes),
        seed_(seed),
        expected_(o.chunks_per_thread),
        written_(o.chunks_per_thread) {}

  // The hashes a writer would have sent, computed before any timing.
  void prepare() override {
    b_.src.fill_pattern(seed_);
    std::memset(b_.staging.data(), 0, b_.staging.size());
    std::memset(b_.dst.data(), 0, b_.dst.size());
    for (size_t i = 0; i < expected_.size(); ++i) expected_[i] = XXH3_128bits(src(i), chunk_);
  }

  void reset(int method) override {
    stream_zero(b_.dst.data(), b_.dst.size());
    if (as_method(method) == IntegrityMethod::kStagingStore) {
      stream_zero(b_.staging.data(), b_.staging.size());
    }
    std::fill(written_.begin(), written_.end(), XXH128_hash_t{});
    mismatches_ = 0;
  }

  void run(int method) override {
    for (size_t i = 0; i < expected_.size(); ++i) run_chunk(as_method(method), i);
  }

  bool check(int method) override {
    const IntegrityMethod m = as_method(method);
    if (mismatches_ != 0) return false;
    if (m == IntegrityMethod::kHashedStore) {
      for (size_t i = 0; i < expected_.size(); ++i) {
        if (!XXH128_isEqual(written_[i], expected_[i])) return false;
      }
    }
    return m == IntegrityMethod::kHashOnly || std::memcmp(b_.src.data(), b_.dst.data(), b_.src.size()) == 0;
  }

 private:
  static IntegrityMethod as_method(int method) { return static_cast<IntegrityMethod>(method); }
  const std::byte* src(size_t i) const { return b_.src.data() + i * chunk_; }
  std::byte* staging(size_t i) { return b_.staging.data() + i * chunk_; }
  std::byte* dst(size_t i) { return b_.dst.data() + i * chunk_; }

  static void stream_chunk(std::byte* to, const std::byte* from, size_t n) {
    copy_bytes(to, from, n, /*stream=*/true);
    streaming_fence();
  }

  // Per block: hash the source block, then stream it out while it is still in L2.
  XXH128_hash_t hash_source_then_stream(std::byte* to, const std::byte* from) {
    XXH3_128bits_reset(state_.get());
    for (size_t off = 0; off < chunk_; off += block_) {
      const size_t n = std::min(block_, chunk_ - off);
      XXH3_128bits_update(state_.get(), from + off, n);
      copy_bytes(to + off, from + off, n, /*stream=*/true);
    }
    streaming_fence();
    return XXH3_128bits_digest(state_.get());
  }

  // Per block: copy, then hash the private copy just written. With streaming stores the
  // block has left the cache and is read back from memory; memcpy leaves it in the cache.
  XXH128_hash_t copy_then_hash_copy(std::byte* to, const std::byte* from, bool stream) {
    XXH3_128bits_reset(state_.get());
    for (size_t off = 0; off < chunk_; off += block_) {
      const size_t n = std::min(block_, chunk_ - off);
      copy_bytes(to + off, from + off, n, stream);
      XXH3_128bits_update(state_.get(), to + off, n);
    }
    if (stream) streaming_fence();
    return XXH3_128bits_digest(state_.get());
  }

  void count(XXH128_hash_t got, size_t i) {
    if (!XXH128_isEqual(got, expected_[i])) ++mismatches_;
  }

  void run_chunk(IntegrityMethod m, size_t i) {
    switch (m) {
      case IntegrityMethod::kCopy:
        stream_chunk(dst(i), src(i), chunk_);
        break;
      case IntegrityMethod::kStagingStore:
        stream_chunk(staging(i), src(i), chunk_);  // the client, then commit
        stream_chunk(dst(i), staging(i), chunk_);  // kdnd, into the arena
        break;
      case IntegrityMethod::kHashedStore:
        written_[i] = hash_source_then_stream(dst(i), src(i));
        break;
      case IntegrityMethod::kVerifyReadSource:
        count(hash_source_then_stream(dst(i), src(i)), i);
        break;
      case IntegrityMethod::kVerifyReadStream:
        count(copy_then_hash_copy(dst(i), src(i), /*stream=*/true), i);
        break;
      case IntegrityMethod::kVerifyReadCached:
        count(copy_then_hash_copy(dst(i), src(i), /*stream=*/false), i);
        break;
      case IntegrityMethod::kHashOnly:
        count(XXH3_128bits(src(i), chunk_), i);
        break;
    }
  }

  LaneBuffers b_;
  HashState state_;
  size_t chunk_, block_;
  uint64_t seed_;
  std::vector<XXH128_hash_t> expected_;  // XXH3-128 of each source chunk
  std::vector<XXH128_hash_t> written_;   // kHashedStore: what the writer would send
  size_t mismatches_ = 0;                // verifying methods: chunks whose hash differed
};

Status validate(const IntegrityOptions& o) {
  if (o.threads == 0 || o.chunk_bytes == 0 || o.chunks_per_thread == 0 || o.block_bytes == 0 || o.repetitions <= 0) {
    return Status(Code::kInvalidArgument,
                  "integrity baseline needs threads, chunk and block bytes, chunks, repetitions");
  }
  if (o.chunks_per_thread > SIZE_MAX / o.chunk_bytes) {
    return Status(Code::kInvalidArgument, "integrity baseline: chunks x chunk bytes overflows");
  }
  return Status();
}

// Buffers are first touched by the lane's own thread (prepare), not here.
Result<std::vector<std::unique_ptr<Lane>>> make_lanes(const IntegrityOptions& o) {
  const size_t bytes = o.chunks_per_thread * o.chunk_bytes;
  std::vector<std::unique_ptr<Lane>> lanes;
  for (unsigned i = 0; i < o.threads; ++i) {
    LaneBuffers b;
    for (PageBuffer* buffer : {&b.src, &b.staging, &b.dst}) {
      Result<PageBuffer> r = PageBuffer::allocate(bytes, /*prefault=*/false);
      if (!r.ok()) return r.status();
      *buffer = std::move(r).value();
    }
    HashState state(XXH3_createState());
    if (!state) return Status(Code::kNoMemory, "XXH3_createState");
    lanes.push_back(std::make_unique<IntegrityLane>(std::move(b), std::move(state), o, i + 1));
  }
  return lanes;
}

}  // namespace

bool integrity_hash_dispatched() noexcept { return KDN_BENCH_XXH3_DISPATCH != 0; }

const char* integrity_method_name(IntegrityMethod method) noexcept {
  switch (method) {
    case IntegrityMethod::kCopy:
      return "copy";
    case IntegrityMethod::kStagingStore:
      return "staging_store";
    case IntegrityMethod::kHashedStore:
      return "hashed_store";
    case IntegrityMethod::kVerifyReadSource:
      return "verify_read_source_hash";
    case IntegrityMethod::kVerifyReadStream:
      return "verify_read_stream";
    case IntegrityMethod::kVerifyReadCached:
      return "verify_read_cached";
    case IntegrityMethod::kHashOnly:
      return "hash";
  }
  return "?";
}

Result<IntegrityResult> integrity_gbps(const IntegrityOptions& options) noexcept {
  KDN_RETURN_IF_ERROR(validate(options));
  Result<std::vector<std::unique_ptr<Lane>>> lanes = make_lanes(options);
  if (!lanes.ok()) return lanes.status();
  std::vector<Lane*> raw;
  for (const std::unique_ptr<Lane>& lane : *lanes) raw.push_back(lane.get());
  Result<MethodSamples> samples = run_timed_lanes(raw, kIntegrityMethods, options.repetitions);
  if (!samples.ok()) return samples.status();
  const uint64_t bytes = uint64_t{options.threads} * options.chunks_per_thread * options.chunk_bytes;
  const std::vector<uint64_t>& copy = (*samples)[static_cast<size_t>(IntegrityMethod::kCopy)];
  IntegrityResult r;
  for (int m = 0; m < kIntegrityMethods; ++m) {
    r.rate[m] = rate_spread((*samples)[static_cast<size_t>(m)], bytes);
    r.vs_copy[m] = paired_ratio((*samples)[static_cast<size_t>(m)], copy);
  }
  r.verify_read =
      r.of(IntegrityMethod::kVerifyReadCached).median_gbps > r.of(IntegrityMethod::kVerifyReadStream).median_gbps
          ? IntegrityMethod::kVerifyReadCached
          : IntegrityMethod::kVerifyReadStream;
  return r;
}

}  // namespace kdn::bench
