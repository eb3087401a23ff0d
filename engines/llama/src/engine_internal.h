// Pieces of the engine shared by its source files (private to kdn_llama_core).
#pragma once

#include <llama.h>

#include <cstdint>

namespace kdn::llama {

constexpr llama_seq_id kSeq = 0;      // the request's sequence
constexpr llama_seq_id kScratch = 1;  // staging: chunks pass through it on load and on extract
constexpr uint32_t kSeqMax = 2;       // n_seq_max of the context

// A llama_batch of one sequence, freed with the object.
class Batch final {
 public:
  explicit Batch(uint32_t capacity) : b_(llama_batch_init(static_cast<int32_t>(capacity), 0, 1)) {}
  ~Batch() { llama_batch_free(b_); }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  void clear() { b_.n_tokens = 0; }
  void add(int32_t token, uint32_t pos, bool logits, llama_seq_id seq = kSeq) {
    const int32_t i = b_.n_tokens++;
    b_.token[i] = token;
    b_.pos[i] = static_cast<llama_pos>(pos);
    b_.n_seq_id[i] = 1;
    b_.seq_id[i][0] = seq;
    b_.logits[i] = logits;
  }
  const llama_batch& get() const { return b_; }

 private:
  llama_batch b_;
};

}  // namespace kdn::llama
