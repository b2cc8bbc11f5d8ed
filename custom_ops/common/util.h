// Small helpers of every layer.
#pragma once

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

}  // namespace ddl
