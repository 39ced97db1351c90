#pragma once
// ddprun-top's one request: GET /api/job from a job's ddprun (--http_port), on a connection of its
// own, within a deadline. Whatever answers on the port is read as a hostile peer's: the header and
// the body are bounded while they are read (however the server splits them into packets, whatever
// Content-Length or chunking it claims), the JSON's nesting is bounded while it is parsed, and an
// error's text is cut and made printable before it reaches a message. Blocking; each call owns
// everything it uses.

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::launcher::top {

struct FetchLimits {
  // A job view is far smaller: the agent lists 256 ranks at most and 256 rows of 120 heat-map
  // columns (well under 1 MiB).
  uint64_t max_body = uint64_t{8} << 20;
  uint32_t max_header = 16 << 10;
  size_t max_depth = 32;  // a job view nests 4 deep
  std::chrono::milliseconds timeout{5000};
};

// The job view ("ddprun-job-view/1") from `host`:`port`; nullopt with `why` (one printable line)
// when there is no answer, an error status, or no job view in it.
std::optional<nlohmann::json> fetch_job_view(const std::string& host, uint16_t port, std::string& why,
                                             const FetchLimits& limits = {});

// `text` as JSON, no deeper than `max_depth` arrays and objects; a discarded value when it is no
// JSON or nests deeper (then `too_deep`, when given, is set).
nlohmann::json parse_bounded(std::string_view text, size_t max_depth, bool* too_deep = nullptr);

}  // namespace ddprun::launcher::top
