// The RAG workload: passages within their band, prompts within theirs, the same draws for the
// same seed, and questions about the prompt's own passages.
#include "rag_workload.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>

namespace kdn::bench {
namespace {

// A token per word (the tests' tokenizer).
uint32_t words(const std::string& s) {
  std::istringstream in(s);
  std::string w;
  uint32_t n = 0;
  while (in >> w) ++n;
  return n;
}

std::vector<RagDocument> corpus() {
  std::vector<RagDocument> docs;
  for (int d = 0; d < 12; ++d) {
    std::string text;
    for (int p = 0; p < 30; ++p) {
      for (int l = 0; l < 4; ++l) {
        for (int w = 0; w < 9; ++w)
          text += "d" + std::to_string(d) + "p" + std::to_string(p) + "w" + std::to_string(w) + " ";
        text += "\n";
      }
      text += "\n";
    }
    docs.push_back({"doc" + std::to_string(d), text});
  }
  docs.push_back({"short", "too short\n"});
  return docs;
}

TEST(RagWorkload, ClassesAreTheDocumentedOnes) {
  const RagClass c2 = rag_class(2048), c4 = rag_class(4096), c8 = rag_class(8192);
  EXPECT_EQ(c2.min_tokens, 300u);
  EXPECT_EQ(c2.max_tokens, 500u);
  EXPECT_EQ(c2.prompts, 50u);
  EXPECT_EQ(c4.max_tokens, 1000u);
  EXPECT_EQ(c4.prompts, 20u);
  EXPECT_EQ(c8.min_k, 8u);
  EXPECT_LE(c8.max_tokens, 1000u);
}

TEST(RagWorkload, PassagesAndPromptsStayInTheirBands) {
  const RagClass c{512, 60, 100, 3, 4, 10, 8};
  const auto docs = corpus();
  const auto pool = cut_passages(docs, c, words, 7);
  ASSERT_EQ(pool.size(), 10u);
  std::set<std::string> texts;
  for (const Passage& p : pool) {
    EXPECT_GE(p.tokens, c.min_tokens);
    EXPECT_LE(p.tokens, c.max_tokens);
    EXPECT_EQ(p.tokens, words(p.text));
    EXPECT_NE(docs[p.doc].name, "short");
    texts.insert(p.text);
  }
  EXPECT_EQ(texts.size(), pool.size()) << "no passage twice";
  const auto size_of = [&](const RagPromptSpec& s) {
    uint32_t n = 0;
    for (uint32_t i : s.passages) n += pool[i].tokens;
    return n;
  };
  const auto prompts = draw_prompts(pool, c, 7, 350, size_of);
  ASSERT_EQ(prompts.size(), 8u);
  std::set<std::vector<uint32_t>> orders;
  for (const RagPromptSpec& s : prompts) {
    EXPECT_GE(s.passages.size(), 3u);
    EXPECT_LE(s.passages.size(), 4u);
    EXPECT_EQ(std::set<uint32_t>(s.passages.begin(), s.passages.end()).size(), s.passages.size());
    EXPECT_LE(size_of(s), 350u);
    EXPECT_FALSE(s.question.empty());
    orders.insert(s.passages);
  }
  EXPECT_GT(orders.size(), 1u);
  // Deterministic for a seed; another seed draws others.
  const auto again = draw_prompts(pool, c, 7, 350, size_of);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(again[i].passages, prompts[i].passages);
    EXPECT_EQ(again[i].question, prompts[i].question);
  }
  EXPECT_EQ(cut_passages(docs, c, words, 7)[3].text, pool[3].text);
  const auto other = draw_prompts(pool, c, 8, 350, size_of);
  bool differs = false;
  for (size_t i = 0; i < prompts.size(); ++i) differs |= other[i].passages != prompts[i].passages;
  EXPECT_TRUE(differs);
}

TEST(RagWorkload, ACorpusTooSmallGivesFewerPassagesNotLongerOnes) {
  const RagClass c{512, 60, 100, 3, 4, 500, 4};
  const auto pool = cut_passages(corpus(), c, words, 1);
  EXPECT_LT(pool.size(), 500u);
  for (const Passage& p : pool) EXPECT_LE(p.tokens, 100u);
}

}  // namespace
}  // namespace kdn::bench
