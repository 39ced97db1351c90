#pragma once
// Numbers from text, the one way ddprun reads them (flags, environment variables, store values,
// /proc): the whole text must be the number. No leading or trailing spaces, no partial match
// ("12abc"), no wrap-around ("-1" is not an unsigned number), no hex, inf or nan. A leading '+'
// is accepted. Callers say what was wrong and what to do; these only answer "a number, or not".
// Header-only: the worker SDK uses it too without linking ddprun's common library.

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <system_error>

namespace ddprun {

namespace numbers_detail {
template <typename T>
std::optional<T> whole(std::string_view text) {
  const char* first = text.data();
  const char* last = first + text.size();
  if (first != last && *first == '+') {
    ++first;
    if (first != last && (*first == '+' || *first == '-')) return std::nullopt;
  }
  if (first == last) return std::nullopt;
  T v{};
  const auto [ptr, ec] = std::from_chars(first, last, v);
  if (ec != std::errc() || ptr != last) return std::nullopt;
  return v;
}
}  // namespace numbers_detail

inline std::optional<int64_t> to_int(std::string_view text) { return numbers_detail::whole<int64_t>(text); }

inline std::optional<uint64_t> to_uint(std::string_view text) {
  if (!text.empty() && text[0] == '-') return std::nullopt;
  return numbers_detail::whole<uint64_t>(text);
}

// Decimal or scientific ("1.5", "2e3"); finite only.
inline std::optional<double> to_double(std::string_view text) {
  const auto v = numbers_detail::whole<double>(text);
  if (!v || !std::isfinite(*v)) return std::nullopt;
  return v;
}

}  // namespace ddprun
