// The rows of a table in a Markdown document, for tests that check kdnd against what its
// documents promise (docs/protocol.md's handshake checks and error table): the document is the
// list of cases, so a row added there without a probe in the test fails the test.
#pragma once

#include <fstream>
#include <string>
#include <vector>

namespace kdn::testing {

// `s` without surrounding blanks (`strip` "` " also drops backquotes around a lone code span).
inline std::string doc_cell(const std::string& s, const char* strip = " ") {
  const auto a = s.find_first_not_of(strip);
  const auto b = s.find_last_not_of(strip);
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The cells of each row of the first table whose header line starts with `header`, inside the
// section whose heading line starts with `heading` (up to the next heading of that level or
// above). Cells are split on '|' and trimmed by doc_cell; the separator line is skipped. Empty
// when the file, the section or the table is missing.
inline std::vector<std::vector<std::string>> doc_table(const std::string& path, const std::string& heading,
                                                       const std::string& header) {
  std::ifstream f(path);
  const size_t level = heading.find_first_not_of('#');
  std::string line;
  bool in_section = false, in_table = false;
  std::vector<std::vector<std::string>> rows;
  while (std::getline(f, line)) {
    const size_t hashes = line.find_first_not_of('#');
    if (hashes != 0 && hashes != std::string::npos && hashes <= level && line[hashes] == ' ') {
      if (in_table) break;
      in_section = line.rfind(heading, 0) == 0;
      continue;
    }
    if (!in_section) continue;
    const std::string t = doc_cell(line);
    if (!in_table) {
      in_table = t.rfind(header, 0) == 0;
      continue;
    }
    if (t.empty() || t[0] != '|') break;
    if (t.rfind("|--", 0) == 0 || t.rfind("|-:", 0) == 0 || t.rfind("|:-", 0) == 0) continue;
    std::vector<std::string> cells;
    size_t from = 1;
    for (size_t bar = t.find('|', from); bar != std::string::npos; bar = t.find('|', from)) {
      cells.push_back(doc_cell(t.substr(from, bar - from)));
      from = bar + 1;
    }
    rows.push_back(std::move(cells));
  }
  return rows;
}

}  // namespace kdn::testing
