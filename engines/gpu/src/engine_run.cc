#include "engine_run.h"

#include <cstring>

namespace kdn::gpu_engine {
namespace {

struct Plan {
  uint32_t chunks = 0;
  std::vector<int32_t> tokens;
  BlockTables tables;
};

EngineStatus plan(const EngineSession& s, const RunOptions& o, Plan* p) {
  const uint32_t T = s.chunk_tokens();
  if (o.tokens == 0 || T == 0 || o.tokens % T) {
    return {KDN_ERR_INVALID_ARGUMENT, "--tokens must be a positive multiple of " + std::to_string(T)};
  }
  const uint64_t blocks = (o.tokens + s.shape().block_size - 1) / s.shape().block_size;
  if (blocks > s.shape().num_blocks) return {KDN_ERR_INVALID_ARGUMENT, "the cache is smaller than the sequence"};
  p->chunks = uint32_t(o.tokens / T);
  p->tokens = sequence_tokens(o.seed, o.tokens);
  p->tables = store_and_retrieve_tables(s.shape().num_blocks, uint32_t(blocks), o.seed);
  return {};
}

std::vector<int32_t> no_owners(const EngineSession& s) { return std::vector<int32_t>(s.shape().slots(), -1); }

}  // namespace

EngineStatus run_store(EngineSession& s, const RunOptions& o, RunResult* r) {
  Plan p;
  if (auto st = plan(s, o, &p); !st.ok()) return st;
  r->chunks = p.chunks;
  auto slots = slot_mapping(p.tables.store, o.tokens, s.shape().block_size);
  if (auto st = s.fill(o.seed, slot_owners(slots, s.shape().slots())); !st.ok()) return st;
  auto layout = s.layout(std::move(slots));
  return s.store(p.tokens, *layout, 0, p.chunks, &r->stored);
}

EngineStatus run_retrieve(EngineSession& s, const RunOptions& o, RunResult* r) {
  Plan p;
  if (auto st = plan(s, o, &p); !st.ok()) return st;
  r->chunks = p.chunks;
  auto slots = slot_mapping(p.tables.retrieve, o.tokens, s.shape().block_size);
  const auto owners = slot_owners(slots, s.shape().slots());
  auto layout = s.layout(std::move(slots));
  for (uint32_t i = 0; i < o.repeat; ++i) {
    if (auto st = s.fill(o.seed, no_owners(s)); !st.ok()) return st;
    if (auto st = s.retrieve(p.tokens, *layout, 0, &r->loaded); !st.ok()) return st;
    if (r->loaded != p.chunks) {
      return {KDN_ERR_NOT_FOUND,
              "kdn_gpu_retrieve loaded " + std::to_string(r->loaded) + " of " + std::to_string(p.chunks) + " chunks"};
    }
    uint64_t bad = 0;
    if (auto st = s.verify(o.seed, owners, &bad); !st.ok()) return st;
    r->mismatches += bad;
    ++r->rounds;
    if (bad) return {KDN_ERR_CORRUPT, std::to_string(bad) + " elements or guard bytes differ after a retrieve"};
  }
  return {};
}

EngineStatus run_stale(EngineSession& s, const RunOptions& o, RunResult* r) {
  if (auto st = run_store(s, o, r); !st.ok()) return st;
  Plan p;
  if (auto st = plan(s, o, &p); !st.ok()) return st;

  // 1. A layout whose last token lies one block past the registered range.
  auto slots = slot_mapping(p.tables.retrieve, o.tokens, s.shape().block_size);
  slots.back() = int64_t(s.shape().slots()) + s.shape().block_size - 1;
  auto outside = s.layout(slots);
  if (auto st = s.fill(o.seed, no_owners(s)); !st.ok()) return st;
  uint32_t loaded = 0;
  EngineStatus st = s.retrieve(p.tokens, *outside, 0, &loaded);
  if (st.code() != KDN_ERR_INVALID_ARGUMENT) {
    return {KDN_ERR_INTERNAL, "a layout past the registered range was not refused with KDN_ERR_INVALID_ARGUMENT: " +
                                  (st.ok() ? std::string("it succeeded") : st.message())};
  }
  uint64_t bad = 0;
  if (auto vs = s.verify(o.seed, no_owners(s), &bad); !vs.ok()) return vs;
  if (bad) return {KDN_ERR_CORRUPT, "a refused retrieve changed " + std::to_string(bad) + " elements"};
  r->checks += "out-of-range layout refused, nothing written; ";

  // 2. The handle of an allocation that is gone, after the engine unregistered.
  if (auto us = s.unregister(); !us.ok()) return us;
  kdn_gpu_kv_desc stale;
  {
    std::unique_ptr<DeviceKv> gone;
    if (auto cs = DeviceKv::create(s.kv().device(), s.kv().kind(), s.shape(), &gone); !cs.ok()) return cs;
    gone->describe(&stale);
    // A live event, so that only the memory handle is stale.
    if (auto es = s.engine_event_handle(stale.engine_event); !es.ok()) return es;
  }  // freed (and, for vmm, its descriptor closed) here
  kdn_gpu_kv* kv = nullptr;
  const int rc = kdn_gpu_register(s.client(), &stale, &kv);
  if (rc == KDN_OK) {
    (void)kdn_gpu_unregister(s.client(), kv);
    return {KDN_ERR_INTERNAL, "kdnd accepted the registration of a freed allocation's handle"};
  }
  r->checks += std::string("freed allocation's handle refused (") + kdn_strerror(rc) + "); ";

  // 3. The engine registers again and everything works.
  if (auto rs = s.reregister(); !rs.ok()) return rs;
  RunOptions again = o;
  again.seed = o.seed ^ 0xA5A5;
  if (auto ss = run_store(s, again, r); !ss.ok()) return ss;
  if (auto rs = run_retrieve(s, again, r); !rs.ok()) return rs;
  r->checks += "registered again: store, retrieve and verify";
  return {};
}

}  // namespace kdn::gpu_engine
