#pragma once
// What the benchmarks share: their list arguments and the statistics they print.

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace ddprun::bench {

// "16,128,1024" -> {16, 128, 1024}
inline std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

// The middle value (the upper one of an even count); v must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace ddprun::bench
