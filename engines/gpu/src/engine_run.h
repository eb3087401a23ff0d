// The modes of kdn-gpu-engine, apart from its command line so that each is a function of an
// open EngineSession (private to engines/gpu).
#pragma once

#include <kdn/gpu_engine/engine_session.h>

#include <cstdint>
#include <string>

namespace kdn::gpu_engine {

struct RunOptions {
  uint64_t tokens = 1024;  // whole chunks
  uint64_t seed = 1;
  uint32_t repeat = 1;  // retrieve + verify rounds
};

struct RunResult {
  uint32_t chunks = 0;      // of the sequence
  uint32_t stored = 0;      // chunks kdnd wrote (not already cached)
  uint32_t loaded = 0;      // chunks of the last retrieve
  uint64_t mismatches = 0;  // summed over every verify
  uint32_t rounds = 0;      // verified retrieves
  std::string checks;       // stale mode: what was checked, in words
};

// Fills the sequence's blocks (shuffled by seed) and stores its chunks.
EngineStatus run_store(EngineSession& s, const RunOptions& o, RunResult* r);
// Retrieves the sequence into other shuffled blocks of a cache of canaries and verifies every
// byte, `repeat` times; a round that loads fewer than every chunk is an error.
EngineStatus run_retrieve(EngineSession& s, const RunOptions& o, RunResult* r);
// Registration edges: a layout reaching past the registered range is refused and writes
// nothing; after unregister, registering a freed allocation's handle is refused; registering
// again works (store, retrieve and verify).
EngineStatus run_stale(EngineSession& s, const RunOptions& o, RunResult* r);

}  // namespace kdn::gpu_engine
