#include "rag_workload.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

namespace kdn::bench {
namespace {

// Manual pages of commands every Debian machine has (coreutils, findutils, grep, sed, tar,
// gzip, procps, bash, less, ...) and a few common tools; a page man cannot render is skipped.
constexpr const char* kManPages[] = {
    "ls",   "cp",  "mv",   "rm",    "ln",  "mkdir", "chmod", "chown", "cat", "sort",  "uniq", "head", "tail",  "grep",
    "sed",  "awk", "find", "xargs", "tar", "gzip",  "du",    "df",    "ps",  "top",   "kill", "ssh",  "curl",  "make",
    "bash", "git", "date", "wc",    "tr",  "tee",   "diff",  "less",  "env", "touch", "stat", "cut",  "rsync", "nice",
};

// Lines without leading blanks, runs of blanks as one, no overstrike (x\bx) or escapes, at most
// one empty line in a row: the text, without the layout of a terminal.
std::string normalize(const std::string& raw) {
  std::string clean;
  for (size_t i = 0; i < raw.size(); ++i) {
    const char c = raw[i];
    if (c == '\b') {
      if (!clean.empty()) clean.pop_back();
      continue;
    }
    if (c == '\x1b') {  // an escape sequence: skip to its final letter
      while (i + 1 < raw.size() && !std::isalpha(static_cast<unsigned char>(raw[i + 1]))) ++i;
      ++i;
      continue;
    }
    if (c == '\r' || c == '\f') continue;
    clean += c == '\t' ? ' ' : c;
  }
  std::string out;
  std::istringstream in(clean);
  std::string line;
  bool blank = true;
  while (std::getline(in, line)) {
    std::string l;
    for (char c : line)
      if (c != ' ' || (!l.empty() && l.back() != ' ')) l += c;
    while (!l.empty() && l.back() == ' ') l.pop_back();
    if (l.empty()) {
      if (!blank) out += '\n';
      blank = true;
      continue;
    }
    out += l + '\n';
    blank = false;
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string render_man(const char* page) {
  const std::string cmd = std::string("MANWIDTH=80 man -P cat 1 ") + page + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string w;
  while (in >> w) {
    std::string clean;
    for (char c : w)
      if (c != '"' && c != '\\') clean += c;
    if (!clean.empty()) out.push_back(clean);
  }
  return out;
}

std::string join(const std::vector<std::string>& w, size_t first, size_t n) {
  std::string s;
  for (size_t i = first; i < first + n && i < w.size(); ++i) s += (s.empty() ? "" : " ") + w[i];
  return s;
}

// One passage of `c`'s band from `lines`, starting at a paragraph start chosen by rng, or empty.
std::string cut_one(const std::vector<std::string>& lines, const std::vector<uint32_t>& line_tokens, const RagClass& c,
                    const TokenCount& count, std::mt19937_64& rng, uint32_t* tokens) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < lines.size(); ++i)
    if (!lines[i].empty() && (i == 0 || lines[i - 1].empty())) starts.push_back(i);
  if (starts.empty()) return {};
  for (int attempt = 0; attempt < 12; ++attempt) {
    const uint32_t target = c.min_tokens + uint32_t(rng() % (c.max_tokens - c.min_tokens + 1));
    const size_t start = starts[rng() % starts.size()];
    size_t end = start;
    uint32_t estimate = 0;
    while (end < lines.size() && estimate < target) estimate += line_tokens[end++];
    // Exact count of the passage as a segment (it is followed by "\n\n"); trim to the band.
    for (int fit = 0; fit < 64 && end > start; ++fit) {
      std::string text;
      for (size_t i = start; i < end; ++i) text += lines[i] + '\n';
      while (!text.empty() && text.back() == '\n') text.pop_back();
      const uint32_t n = count(text + "\n\n");
      if (n >= c.min_tokens && n <= c.max_tokens) {
        *tokens = n;
        return text;
      }
      if (n > c.max_tokens)
        --end;
      else if (end < lines.size())
        ++end;
      else
        break;
    }
  }
  return {};
}

}  // namespace

std::vector<RagDocument> rag_corpus() {
  std::vector<RagDocument> docs;
  std::vector<std::filesystem::path> licenses;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses", ec))
    if (e.is_regular_file() && !e.is_symlink()) licenses.push_back(e.path());
  std::sort(licenses.begin(), licenses.end());
  for (const auto& p : licenses) {
    std::string t = normalize(read_file(p.string()));
    if (!t.empty()) docs.push_back({"license/" + p.filename().string(), std::move(t)});
  }
  for (const char* page : kManPages) {
    std::string t = normalize(render_man(page));
    if (t.size() > 200) docs.push_back({std::string("man/") + page, std::move(t)});
  }
  return docs;
}

RagClass rag_class(uint32_t size) {
  if (size == 2048) return {2048, 300, 500, 4, 6, 40, 50};
  if (size == 4096) return {4096, 600, 1000, 4, 6, 30, 20};
  if (size == 8192) return {8192, 850, 1000, 8, 9, 24, 5};
  // Another size: the 2K class's shape, scaled (tests run tiny ones).
  const uint32_t lo = std::max<uint32_t>(size * 300 / 2048, 16), hi = std::max<uint32_t>(size * 500 / 2048, lo + 16);
  return {size, lo, hi, 4, 6, 12, 4};
}

std::vector<Passage> cut_passages(const std::vector<RagDocument>& corpus, const RagClass& c, const TokenCount& count,
                                  uint64_t seed) {
  std::mt19937_64 rng(seed ^ (uint64_t(c.size) << 32));
  std::vector<uint32_t> order(corpus.size());
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<Passage> pool;
  std::vector<std::vector<std::string>> lines(corpus.size());
  std::vector<std::vector<uint32_t>> line_tokens(corpus.size());
  // One passage per document and pass; later passes take more from the longer documents.
  for (int pass = 0; pass < 4 && pool.size() < c.pool; ++pass) {
    for (uint32_t d : order) {
      if (pool.size() >= c.pool) break;
      if (lines[d].empty()) {
        lines[d] = lines_of(corpus[d].text);
        for (const std::string& l : lines[d]) line_tokens[d].push_back(l.empty() ? 1 : count(l + "\n"));
      }
      uint32_t total = 0;
      for (uint32_t t : line_tokens[d]) total += t;
      if (total < c.min_tokens * uint32_t(pass + 1)) continue;  // too short for another passage
      uint32_t n = 0;
      std::string text = cut_one(lines[d], line_tokens[d], c, count, rng, &n);
      if (text.empty()) continue;
      const bool dup = std::any_of(pool.begin(), pool.end(), [&](const Passage& p) { return p.text == text; });
      if (!dup) pool.push_back({d, std::move(text), n});
    }
  }
  return pool;
}

std::vector<RagPromptSpec> draw_prompts(const std::vector<Passage>& pool, const RagClass& c, uint64_t seed,
                                        uint32_t max_prompt_tokens,
                                        const std::function<uint32_t(const RagPromptSpec&)>& prompt_tokens) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + c.size);
  std::vector<RagPromptSpec> out;
  if (pool.empty()) return out;
  for (uint32_t attempt = 0; out.size() < c.prompts && attempt < 1000 * c.prompts; ++attempt) {
    const uint32_t hi = std::min<uint32_t>(c.max_k, uint32_t(pool.size()));
    const uint32_t lo = std::min(c.min_k, hi);
    const uint32_t k = lo + uint32_t(rng() % (hi - lo + 1));
    std::vector<uint32_t> idx(pool.size());
    std::iota(idx.begin(), idx.end(), 0u);
    for (uint32_t i = 0; i < k; ++i) std::swap(idx[i], idx[i + rng() % (idx.size() - i)]);
    RagPromptSpec spec;
    spec.passages.assign(idx.begin(), idx.begin() + k);
    const Passage& about = pool[spec.passages[rng() % k]];
    const std::vector<std::string> w = words_of(about.text);
    const size_t mid = w.size() > 8 ? 4 + rng() % (w.size() - 8) : 0;
    switch (rng() % 3) {
      case 0:
        spec.question = "What does the document that begins with \"" + join(w, 0, 8) + "\" explain? Answer in detail.";
        break;
      case 1:
        spec.question = "Summarize what the documents above say about \"" + join(w, mid, 3) + "\".";
        break;
      default:
        spec.question =
            "Which of the documents above mentions \"" + join(w, mid, 4) + "\", and what does it say about it?";
    }
    if (prompt_tokens(spec) > max_prompt_tokens) continue;
    out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace kdn::bench
