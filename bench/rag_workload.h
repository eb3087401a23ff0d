// The RAG workload of `kdn-bench blend` (docs/blend.md, "Workload"): real documents already on
// the machine, cut into passages, and prompts of several passages drawn at random, in random
// order, each with a question. Nothing here was written or tuned for kdn.
//
//   corpus    the license texts Debian installs (/usr/share/common-licenses, base-files) and the
//             manual pages of common commands (rendered with man(1)); documents shorter than a
//             class's shortest passage are skipped;
//   passages  per size class, `pool` passages of [min_tokens, max_tokens] tokens, each cut from
//             a document (one per document while documents last) at a paragraph start chosen
//             at random, ending on a line break;
//   prompts   per class, `prompts` prompts of k passages (k uniform in [min_k, max_k]) drawn
//             without repetition from the pool, in the order drawn, plus a question about one
//             of them from three templates; a draw over max_prompt_tokens is drawn again.
// Every choice comes from one seeded generator, so a run on the same machine (same documents)
// draws the same prompts; the report lists each document with its size so runs on other
// machines can be compared.
//
// Pure functions of their arguments (the corpus reads the file system and runs man).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kdn::bench {

struct RagDocument {
  std::string name;  // e.g. "license/GPL-3", "man/tar"
  std::string text;
};

// The corpus on this machine, in a fixed order (licenses by name, then the manual pages in the
// built-in list's order; pages man cannot render are left out).
std::vector<RagDocument> rag_corpus();

struct RagClass {
  uint32_t size = 0;        // nominal prompt size (the class's name: 2048, 4096, 8192)
  uint32_t min_tokens = 0;  // passage length band
  uint32_t max_tokens = 0;
  uint32_t min_k = 0, max_k = 0;  // passages per prompt
  uint32_t pool = 0;              // passages cut
  uint32_t prompts = 0;           // prompts drawn
};

// The classes of the benchmark, fixed before any measurement (docs/blend.md): 2K: 300-500
// tokens x 4-6, pool 40, 50 prompts; 4K: 600-1000 x 4-6, pool 30, 20 prompts; 8K: 850-1000 x
// 8-9 (six passages of at most 1000 tokens cannot make 8K), pool 24, 5 prompts. Other sizes
// (tests) scale the 2K class.
RagClass rag_class(uint32_t size);

struct Passage {
  uint32_t doc = 0;  // index in the corpus
  std::string text;
  uint32_t tokens = 0;
};

struct RagPromptSpec {
  std::vector<uint32_t> passages;  // indices into the pool, in prompt order
  std::string question;
};

// Tokens of a text tokenized alone (the engine's tokenizer).
using TokenCount = std::function<uint32_t(const std::string&)>;

// Cuts the class's pool. Fewer than `pool` passages when the corpus cannot give them.
std::vector<Passage> cut_passages(const std::vector<RagDocument>& corpus, const RagClass& c, const TokenCount& count,
                                  uint64_t seed);

// Draws the class's prompts from `pool`; `prompt_tokens(spec)` is the full prompt's size.
std::vector<RagPromptSpec> draw_prompts(const std::vector<Passage>& pool, const RagClass& c, uint64_t seed,
                                        uint32_t max_prompt_tokens,
                                        const std::function<uint32_t(const RagPromptSpec&)>& prompt_tokens);

}  // namespace kdn::bench
