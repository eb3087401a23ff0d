// One model's part of the node benchmark: a fresh kdnd, P engine processes, and the phases
// that measure it. Figures go into the report under "models.<model>".
//
// Phases, in order (each engine's work starts together, see engine_fleet.h):
//   store     engine p stores its own `store_docs` documents (cold): aggregated store GB/s
//   retrieve  engine p retrieves engine p+1's documents, `retrieve_passes` times (all hits,
//             so every byte crosses processes): aggregated retrieve GB/s
//   lookup    engine 0 alone: timed kdn_lookup of a cached 8K-token prompt, then kdn_ping
//   zipf      every engine serves its share of `requests` RAG requests over the corpus:
//             lookup, retrieve the cached prefix, store the rest; hit ratio
//   idle      nobody sends anything for `idle_seconds`, engines stay connected: kdnd CPU %
// "Aggregated" is bytes moved by all engines over the phase's wall time (first engine's
// start to last engine's end), which is how the P-thread memcpy baseline is timed too.
#pragma once

#include "node_workload.h"
#include "report.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kdn::bench {

struct ModelPlan {
  ModelLayout layout;
  unsigned processes = 2;
  uint64_t arena_bytes = 0;
  uint32_t corpus_docs = 0;  // Zipf corpus: documents [0, corpus_docs)
  uint32_t requests = 0;     // Zipf requests over all engines
  uint32_t store_docs = 0;   // per engine, documents beyond the corpus
  uint32_t retrieve_passes = 3;
  uint32_t lookup_samples = 20000;
  uint32_t idle_seconds = 10;
  double zipf_s = 1.1;
  uint64_t seed = 0;
  std::string kdnd_binary;
  std::vector<std::string> kdnd_args;  // extra flags for kdnd
};

// Runs every phase; false if a phase failed (the reason is in "models.<model>.errors" and on
// stderr). Figures of phases that ran stay in the report either way.
bool run_model(const ModelPlan& plan, Report& report);

}  // namespace kdn::bench
