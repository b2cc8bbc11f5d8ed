// Small helpers of every layer.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <string>
#include <vector>

namespace ddl {

// `n` rounded up to a multiple of `to` (> 0).
inline size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// "2, 3, 5": ranks for an error message.
inline std::string RankList(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

// "0-3, 6, 9-10": sorted ranks with runs of consecutive ranks shortened.
inline std::string RankRuns(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += (text.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) text += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return text;
}

// This machine's host name ("?" if it has none to give).
inline std::string HostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

}  // namespace ddl
