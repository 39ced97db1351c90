#pragma once
// The rows of ddprun's option tables: ddprun's flags (launcher/cli/flags.cpp), its --rdzv_conf keys
// (launcher/cli/options_rendezvous.cpp) and ddprun-rendezvous's flags (rendezvous/daemon/daemon_flags.cpp)
// are each an array of OptionRow, as redis's config table is: a name, its other spellings, the value's
// type and range, the member it sets, the help. Parsing, --help, the man page and the docs' tables
// come from the rows, and a bad value is said one way everywhere: "FLAG: expected WHAT, got 'TEXT'".
//
// A row whose value is a number, seconds, text or a switch names its member and, for numbers and
// seconds, its range; the default it shows is the member's value in default-constructed options:
//
//   {"--max_restarts", "", "N", "times the worker group is restarted", whole<&LaunchOptions::max_restarts>(0, 1000)}
//   {"--job-ttl", "", "SECONDS", "...", seconds<&ServeConfig::options, &ServerOptions::job_ttl>(true)}
//
// A member inside a member is the path of both. A row whose value does more (checks against other
// options, sets several members) gives its own conversion and how it shows its default: {apply, shown}.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

#include "common/errors.hpp"
#include "common/numbers.hpp"

namespace ddprun::options {

// A value as given, for its row: `flag` as the user spelled it ("--max_restarts", "--rdzv_conf
// join_timeout", or the environment variable it came from), `text` the value ("1" for a switch).
struct OptionInput {
  const std::string& flag;
  const std::string& text;
};

// The one wording of a bad value.
[[noreturn]] inline void bad_value(const std::string& flag, const std::string& expected, const std::string& got) {
  throw ConfigError(flag + ": expected " + expected + ", got '" + got + "'");
}

// What a port must be, in every program's words.
inline constexpr const char* kPortExpected = "a port from 0 to 65535";

inline std::string whole_range_text(int64_t lo, int64_t hi) {
  return "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
}

// A whole number in [lo, hi]; `expected` says what was wanted (default: "a whole number from lo to hi").
inline int64_t parse_whole(const std::string& flag, const std::string& text, int64_t lo, int64_t hi,
                           const std::string& expected = "") {
  const auto v = to_int(text);
  if (v && *v >= lo && *v <= hi) return *v;
  bad_value(flag, expected.empty() ? whole_range_text(lo, hi) : expected, text);
}

// A number of seconds, > 0 (>= 0 with allow_zero) and at most `max`, as milliseconds.
inline std::chrono::milliseconds parse_seconds(const std::string& flag, const std::string& text, bool allow_zero,
                                               double max = 1e7, const std::string& expected = "") {
  const auto v = to_double(text);
  if (v && (*v > 0 || (allow_zero && *v == 0)) && *v <= max) {
    return std::chrono::milliseconds(static_cast<long long>(*v * 1000));
  }
  bad_value(flag,
            !expected.empty() ? expected
            : allow_zero      ? "a number of seconds >= 0"
                              : "a number of seconds > 0",
            text);
}

// A value without the blanks and tabs around it.
inline std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// 1.5 -> "1.5", 30.0 -> "30": a number as the user would write it.
inline std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

inline std::string seconds_text(std::chrono::milliseconds ms) {
  return number_text(static_cast<double>(ms.count()) / 1000);
}

namespace rows_detail {

template <class T>
struct member_traits;
template <class C, class M>
struct member_traits<M C::*> {
  using owner = C;
};

template <auto... Path>
struct path_owner;
template <auto First, auto... Rest>
struct path_owner<First, Rest...> {
  using type = typename member_traits<decltype(First)>::owner;
};
// The options a path of member pointers starts from.
template <auto... Path>
using owner_of = typename path_owner<Path...>::type;

// The member a path of member pointers leads to: at<&A::b, &B::c>(a) is a.b.c.
template <auto First, auto... Rest, class O>
auto& at(O& o) {
  if constexpr (sizeof...(Rest) == 0) {
    return o.*First;
  } else {
    return at<Rest...>(o.*First);
  }
}

template <auto... Path>
void set_whole(const OptionInput& in, owner_of<Path...>& o, const int64_t range[2], const char* expected) {
  using T = std::remove_reference_t<decltype(at<Path...>(o))>;
  at<Path...>(o) = static_cast<T>(parse_whole(in.flag, trim(in.text), range[0], range[1], expected ? expected : ""));
}

template <auto... Path>
std::string show_whole(const owner_of<Path...>& d) {
  return std::to_string(at<Path...>(d));
}

template <auto... Path>
void set_seconds(const OptionInput& in, owner_of<Path...>& o, const int64_t range[2], const char* expected) {
  at<Path...>(o) =
      parse_seconds(in.flag, trim(in.text), range[0] == 0, static_cast<double>(range[1]), expected ? expected : "");
}

template <auto... Path>
std::string show_seconds(const owner_of<Path...>& d) {
  return seconds_text(at<Path...>(d));
}

template <auto... Path>
void set_text(const OptionInput& in, owner_of<Path...>& o, const int64_t[2], const char*) {
  at<Path...>(o) = in.text;
}

template <auto... Path>
std::string show_text(const owner_of<Path...>& d) {
  return at<Path...>(d);
}

template <auto... Path>
void set_on(const OptionInput&, owner_of<Path...>& o, const int64_t[2], const char*) {
  at<Path...>(o) = true;
}

template <auto... Path>
void set_off(const OptionInput&, owner_of<Path...>& o, const int64_t[2], const char*) {
  at<Path...>(o) = false;
}

}  // namespace rows_detail

// A typed member's conversion: whole(), seconds(), text(), on() below make them.
template <class Options>
struct Typed {
  void (*set)(const OptionInput& in, Options& o, const int64_t range[2], const char* expected);
  std::string (*shown)(const Options& defaults);
  int64_t range[2];
  const char* expected;  // what a bad value should have been, where the range does not say it
};

// How a row's value reaches the options: a typed member with its range, or the row's own conversion
// (a function or a captureless lambda, with how it shows its default: `{apply, shown}`).
template <class Options, class Input = OptionInput>
class Setter {
 public:
  constexpr Setter(const Typed<Options>& typed) : typed_(typed) {}  // NOLINT(google-explicit-constructor)
  template <class Apply, class Shown = std::nullptr_t>
  constexpr Setter(Apply convert, Shown show = nullptr)  // NOLINT(google-explicit-constructor)
      : custom_(convert), typed_{nullptr, show, {0, 0}, nullptr} {}

  void apply(const Input& in, Options& o) const {
    if (custom_) {
      custom_(in, o);
    } else {
      typed_.set(in, o, typed_.range, typed_.expected);
    }
  }
  // The default as shown, from default-constructed options; nullptr where the row's note says it.
  std::string (*shown() const)(const Options&) { return typed_.shown; }

 private:
  void (*custom_)(const Input& in, Options& o) = nullptr;
  Typed<Options> typed_;
};

// A whole-number member in [lo, hi].
template <auto... Path>
constexpr Typed<rows_detail::owner_of<Path...>> whole(int64_t lo, int64_t hi, const char* expected = nullptr) {
  return {&rows_detail::set_whole<Path...>, &rows_detail::show_whole<Path...>, {lo, hi}, expected};
}

// A std::chrono::milliseconds member given in seconds: > 0 (>= 0 with allow_zero), at most `max`.
template <auto... Path>
constexpr Typed<rows_detail::owner_of<Path...>> seconds(bool allow_zero, double max = 1e7,
                                                        const char* expected = nullptr) {
  return {&rows_detail::set_seconds<Path...>,
          &rows_detail::show_seconds<Path...>,
          {allow_zero ? 0 : 1, static_cast<int64_t>(max)},
          expected};
}

// A std::string member: the value as given (its default shown unless `show_default` is false).
template <auto... Path>
constexpr Typed<rows_detail::owner_of<Path...>> text(bool show_default = true) {
  return {&rows_detail::set_text<Path...>, show_default ? &rows_detail::show_text<Path...> : nullptr, {0, 0}, nullptr};
}

// A bool member a switch turns on.
template <auto... Path>
constexpr Typed<rows_detail::owner_of<Path...>> on() {
  return {&rows_detail::set_on<Path...>, nullptr, {0, 0}, nullptr};
}

// A bool member, on by default, that a switch turns off (`--no-...`).
template <auto... Path>
constexpr Typed<rows_detail::owner_of<Path...>> off() {
  return {&rows_detail::set_off<Path...>, nullptr, {0, 0}, nullptr};
}

template <class Options, class Input = OptionInput>
struct OptionRow {
  const char* name;     // canonical spelling
  const char* aliases;  // other spellings, comma-separated; "" for none
  // The value's placeholder in --help ("N", "SECONDS"); nullptr for a switch, and for a --rdzv_conf
  // key (KEY=VALUE says it). With `optional_value`, the placeholder of the value a switch may take inline.
  const char* value;
  // What the option does, in `backticks` for names and values (--help prints them plain).
  const char* help;
  Setter<Options, Input> set;
  const char* note = "";  // the default in words, where `set.shown` is nullptr; "" for none
  // Read when the flag is not given: the environment variable that stands for it, or nullptr.
  const char* env = nullptr;
  // A switch that also takes a value inline (--local_rank_arg or --local_rank_arg=dash).
  bool optional_value = false;
  // In the docs' table: where the option is explained at length (a Markdown link), or nullptr.
  const char* see = nullptr;
  bool etcd_only = false;  // a --rdzv_conf key meaningful with --rdzv_backend etcd alone

  bool takes_value() const { return value != nullptr && !optional_value; }
  // The default as --help and the docs state it, from default-constructed options.
  std::string default_text(const Options& defaults) const {
    return set.shown() ? set.shown()(defaults) : std::string(note);
  }
  // Asks `fn` of the name, then of each alias, until it says true: whether it did.
  template <class Fn>
  bool any_name(Fn&& fn) const {
    if (fn(std::string_view(name))) return true;
    std::string_view rest = aliases ? aliases : "";
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      if (fn(rest.substr(0, comma))) return true;
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    return false;
  }
  // Whether `spelled` is this row's name or one of its aliases (exactly).
  bool named(std::string_view spelled) const {
    return any_name([spelled](std::string_view n) { return n == spelled; });
  }
};

}  // namespace ddprun::options
