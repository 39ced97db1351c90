#include "rendezvous/daemon/daemon_flags.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "common/command_line.hpp"
#include "common/defaults.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/numbers.hpp"
#include "common/option_rows.hpp"
#include "rendezvous/server/host_check.hpp"

namespace ddprun::rdzv::daemon {

namespace {

using command_line::FlagShape;
using command_line::Takes;

using options::bad_value;
using options::off;
using options::on;
using options::OptionInput;
using options::seconds;
using options::text;
using options::whole;

std::optional<std::string> token_file_from_env() {
  const char* v = std::getenv("DDPRUN_TOKEN_FILE");
  return v && *v ? std::optional<std::string>(v) : std::nullopt;
}

// One server flag (common/option_rows.hpp); its default is shown from serve_defaults().
using ServeFlag = options::OptionRow<ServeConfig>;

constexpr ServeFlag kServeFlags[] = {
    {"--host", "", "ADDR",
     "address to listen on (`::` for IPv6 and IPv4); any other than loopback needs `--token-file` or `--insecure`",
     text<&ServeConfig::options, &server::ServerOptions::host>()},
    {"--port", "", "N", "port to listen on; `0` lets the kernel pick one",
     whole<&ServeConfig::options, &server::ServerOptions::port>(0, 65535, options::kPortExpected)},
    {"--port-file", "", "PATH", "after binding, write the chosen port to PATH, atomically (for `--port 0`)",
     text<&ServeConfig::port_file>(false), "none"},
    {"--token-file", "", "PATH",
     "protect the store with the secret in PATH (mode 600, yours): every client proves it (HMAC-SHA256 challenge) "
     "before any key operation, and is bound to one job's keys",
     [](const OptionInput& in, ServeConfig& c) { c.token_file = in.text; }, "none"},
    {"--insecure", "", nullptr,
     "listen on a non-loopback address without a secret (anyone who reaches the port can read, change and end "
     "every job)",
     on<&ServeConfig::insecure>(), "off"},
    {"--handshake-timeout", "", "SECONDS",
     "with `--token-file`: close a connection that has not proved the secret SECONDS after it connected",
     seconds<&ServeConfig::options, &server::ServerOptions::handshake_timeout>(false, 3600,
                                                                               "a number of seconds in (0, 3600]")},
    {"--max-pending-handshakes", "", "N",
     "with `--token-file`: most connections not yet proven at once (at most a quarter of the descriptor limit); at "
     "that many, a newcomer closes the oldest once it has been open 0.5 s (accepting waits until then)",
     whole<&ServeConfig::options, &server::ServerOptions::max_pending_handshakes>(1, int64_t{1} << 20)},
    {"--request-timeout", "", "SECONDS",
     "close a connection whose request has not arrived whole SECONDS after the first of its bytes that waits for "
     "the rest",
     seconds<&ServeConfig::options, &server::ServerOptions::request_timeout>(false, 3600,
                                                                             "a number of seconds in (0, 3600]")},
    {"--max-unfinished-bytes", "", "N",
     "most bytes the requests held for all connections take together: unfinished ones, and those read that wait "
     "for their client to read its replies (never under twice the request limit of 64 MiB); past it, the "
     "connection that has held its bytes longest is closed",
     whole<&ServeConfig::options, &server::ServerOptions::max_unfinished_bytes>(0, int64_t{1} << 50)},
    {"--max-owed-bytes", "", "N",
     "most bytes the replies owed to all connections hold together, copied (never under twice "
     "`--max-reply-bytes`; a large value is shared with the store, not copied); past it, the connection that has "
     "taken nothing of its replies for longest is closed",
     whole<&ServeConfig::options, &server::ServerOptions::max_owed_bytes>(0, int64_t{1} << 50)},
    {"--no-cede", "", nullptr,
     "serve each wake-up at once, rather than first letting the threads that wait for this CPU run "
     "(`sched_yield`) and then serving all that arrived meanwhile in one turn; ceding makes the store on a busy "
     "node faster (fewer wake-ups, each preempting a client less) and costs a lone client on an idle host about "
     "5 us per request (docs/benchmarks.md)",
     off<&ServeConfig::options, &server::ServerOptions::cede_when_busy>(), "cedes"},
    {"--max-key-bytes", "", "N", "longest key accepted",
     whole<&ServeConfig::options, &server::ServerOptions::limits, &core::Limits::max_key_bytes>(0, int64_t{1} << 30)},
    {"--max-value-bytes",
     "",
     "N",
     "largest value accepted",
     {[](const OptionInput& in, ServeConfig& c) {
        core::Limits& l = c.options.limits;
        l.max_value_bytes = static_cast<uint64_t>(options::parse_whole(in.flag, in.text, 0, int64_t{1} << 32));
        l.max_request_bytes = std::max(l.max_request_bytes, l.max_value_bytes * 2);
      },
      [](const ServeConfig& d) { return std::to_string(d.options.limits.max_value_bytes); }}},
    {"--max-keys", "", "N", "most keys in one request",
     whole<&ServeConfig::options, &server::ServerOptions::limits, &core::Limits::max_keys_per_request>(
         0, int64_t{1} << 24)},
    {"--max-reply-bytes", "", "N", "largest reply one request may produce (counted before it is built)",
     whole<&ServeConfig::options, &server::ServerOptions::limits, &core::Limits::max_reply_bytes>(0, int64_t{1} << 40)},
    {"--max-total-keys", "", "N", "most keys (and queues) the store holds",
     whole<&ServeConfig::options, &server::ServerOptions::store_limits, &core::StoreLimits::max_total_keys>(
         0, int64_t{1} << 40)},
    {"--max-store-bytes", "", "N", "most bytes of keys and values the store holds",
     whole<&ServeConfig::options, &server::ServerOptions::store_limits, &core::StoreLimits::max_store_bytes>(
         0, int64_t{1} << 50)},
    {"--job-max-keys", "", "N",
     "most keys one job (its keys under `/ddprun/<run id>/`) holds; `0` for no quota. Not given: a quarter of "
     "`--max-total-keys`, at most 131072, so one job never fills the store",
     whole<&ServeConfig::options, &server::ServerOptions::store_limits, &core::StoreLimits::max_job_keys>(
         0, int64_t{1} << 40)},
    {"--job-max-bytes", "", "N",
     "most bytes one job holds; `0` for no quota. Not given: a quarter of `--max-store-bytes`, at most 256 MiB",
     whole<&ServeConfig::options, &server::ServerOptions::store_limits, &core::StoreLimits::max_job_bytes>(
         0, int64_t{1} << 50)},
    {"--metrics-port", "", "N",
     "serve Prometheus metrics at `http://HOST:N/metrics` and the jobs' page at `/ui` (to this host; to anyone "
     "when the store is open), on the store's address (`0` lets the kernel pick the port, printed at start)",
     [](const OptionInput& in, ServeConfig& c) {
       c.metrics_port = static_cast<uint16_t>(options::parse_whole(in.flag, in.text, 0, 65535, options::kPortExpected));
     },
     "off"},
    {"--metrics-allowed-hosts", "", "NAMES",
     "more names the jobs' page may be asked under, comma-separated (`node7.example.com`, `10.0.0.7`, "
     "`.example.com` for a domain, `*` for any): it answers only requests addressed to this host by one of its "
     "names or addresses, so that no page of another site whose name resolves here (DNS rebinding) reads it",
     [](const OptionInput& in, ServeConfig& c) {
       c.metrics_allowed_hosts = server::parse_allowed_hosts(in.flag, in.text);
     },
     "this host's names and addresses"},
    {"--job-ttl", "", "SECONDS",
     "forget a ddprun job at once when all its nodes have left, or after SECONDS without any change (its agents "
     "were killed); `0` keeps every key",
     seconds<&ServeConfig::options, &server::ServerOptions::job_ttl>(true)},
    {"--state-file", "", "PATH",
     "keep the store's contents in PATH across restarts: a daemon killed and started again on the same PATH (and "
     "port) within the agents' reconnect window (`--rdzv_conf store_reconnect_timeout`, 30 s) ends no running "
     "job. Each change is written before its reply; no fsync per write (the file outlives the daemon, not a crash "
     "of its machine)",
     [](const OptionInput& in, ServeConfig& c) {
       if (in.text.empty()) bad_value(in.flag, "a path", in.text);
       c.options.state_file = in.text;
     },
     "memory only"},
    {"--log-level",
     "",
     "LEVEL",
     "`debug`, `info`, `warn` or `error`; also read from `DDPRUN_LOG_LEVEL`",
     {[](const OptionInput& in, ServeConfig&) {
        log::Level level;
        if (!log::parse_level(in.text, level)) bad_value(in.flag, "debug, info, warn or error", in.text);
        log::set_level(level);
      },
      [](const ServeConfig&) { return std::string(log::level_word(log::current())); }}},
};

// The row `spelled` names, dashes and underscores alike after the leading "--" (name or alias).
template <class Row, size_t N>
const Row* find_row(const Row (&rows)[N], const std::string& spelled) {
  const std::string name = command_line::canonical(spelled);
  for (const Row& row : rows) {
    if (row.any_name([&](std::string_view n) { return command_line::canonical(n) == name; })) return &row;
  }
  return nullptr;
}

const ServeFlag* find_serve_flag(const std::string& spelled) { return find_row(kServeFlags, spelled); }

// The status and token subcommands' flags: rows over what each parses (their --help is usage_text's).
constexpr options::OptionRow<StatusFlags> kStatusFlags[] = {
    {"--endpoint", "", "HOST:PORT", "the store", text<&StatusFlags::endpoint>()},
    {"--token-file", "", "PATH", "the secret or a job's token",
     [](const OptionInput& in, StatusFlags& s) { s.token_file = in.text; }},
};
constexpr options::OptionRow<TokenFlags> kTokenFlags[] = {
    {"--token-file", "", "PATH", "the daemon's secret",
     [](const OptionInput& in, TokenFlags& t) { t.token_file = in.text; }},
    {"--rdzv-id", "--run-id", "ID", "the job", text<&TokenFlags::run_id>()},
    {"--output", "", "PATH", "where the token goes", text<&TokenFlags::output>()},
};

// A subcommand's flags, each through its row.
template <class Flags, size_t N>
Flags parse_sub_flags(const std::string& sub, const std::vector<std::string>& args,
                      const options::OptionRow<Flags> (&rows)[N]) {
  Flags flags;
  const size_t rest = command_line::walk(
      args, 0,
      [&](const std::string& name) -> std::optional<FlagShape> {
        if (!find_row(rows, name)) return std::nullopt;
        return FlagShape{Takes::Value, "", ""};
      },
      [&](const std::string& name, const std::optional<std::string>& value) {
        const std::string text = value.value_or("");
        find_row(rows, name)->set.apply(OptionInput{name, text}, flags);
        return true;
      },
      " of " + sub);
  if (rest < args.size()) throw ConfigError(sub + ": unexpected argument '" + args[rest] + "'");
  // Not given (or given empty): DDPRUN_TOKEN_FILE.
  if (!flags.token_file || flags.token_file->empty()) flags.token_file = token_file_from_env();
  return flags;
}

}  // namespace

constexpr uint64_t kDefaultJobKeys = 131072;
constexpr uint64_t kDefaultJobBytes = uint64_t{256} << 20;

ServeConfig serve_defaults() {
  ServeConfig c;
  c.options.host = "127.0.0.1";
  c.options.port = defaults::kStorePort;
  c.options.store_limits.max_job_keys = kDefaultJobKeys;
  c.options.store_limits.max_job_bytes = kDefaultJobBytes;
  c.options.job_ttl = std::chrono::hours(1);
  c.options.describe_self = true;
  return c;
}

ServeConfig parse_serve_flags(const std::vector<std::string>& args) {
  ServeConfig c = serve_defaults();
  command_line::StandardFlags standard;
  auto lookup = [](const std::string& name) -> std::optional<FlagShape> {
    if (auto shape = command_line::StandardFlags::shape(name)) return shape;
    const ServeFlag* f = find_serve_flag(name);
    if (!f) return std::nullopt;
    return FlagShape{f->value ? Takes::Value : Takes::Nothing, f->help, ""};
  };
  bool job_keys_given = false, job_bytes_given = false;
  auto on_flag = [&](const std::string& name, const std::optional<std::string>& value) {
    if (!standard.take(name, value)) {
      const ServeFlag* f = find_serve_flag(name);
      job_keys_given |= std::string_view(f->name) == "--job-max-keys";
      job_bytes_given |= std::string_view(f->name) == "--job-max-bytes";
      const std::string text = value.value_or("");
      f->set.apply(OptionInput{name, text}, c);
    }
    return standard.go_on();
  };
  const size_t rest = command_line::walk(args, 0, lookup, on_flag);
  c.help = standard.help;
  c.help_markdown = standard.markdown;
  c.version = standard.version;
  // Per-job quotas not given: a share of the store-wide limits, so that smaller limits still leave
  // room for several jobs (a quota above the store's would let one job's token fill it).
  core::StoreLimits& limits = c.options.store_limits;
  if (!job_keys_given)
    limits.max_job_keys = std::max<uint64_t>(1, std::min(kDefaultJobKeys, limits.max_total_keys / 4));
  if (!job_bytes_given) {
    limits.max_job_bytes = std::max<uint64_t>(1, std::min(kDefaultJobBytes, limits.max_store_bytes / 4));
  }
  if (!c.help && !c.version && rest < args.size()) {
    throw ConfigError("unexpected argument '" + args[rest] + "' (the subcommands are status and token)");
  }
  return c;
}

StatusFlags parse_status_flags(const std::vector<std::string>& args) {
  StatusFlags s = parse_sub_flags("status", args, kStatusFlags);
  if (s.endpoint.empty()) throw ConfigError("status needs --endpoint HOST:PORT");
  return s;
}

TokenFlags parse_token_flags(const std::vector<std::string>& args) {
  TokenFlags t = parse_sub_flags("token", args, kTokenFlags);
  if (!t.token_file) throw ConfigError("token needs --token-file PATH (the daemon's secret)");
  return t;
}

std::string usage_text() {
  std::ostringstream out;
  out << "Usage: ddprun-rendezvous [OPTIONS]\n"
         "       ddprun-rendezvous status --endpoint HOST:PORT [--token-file PATH]\n"
         "       ddprun-rendezvous token --token-file PATH --rdzv_id ID [--output PATH]\n\n"
         "Serves a PyTorch-compatible TCPStore (1.13 and 2.x clients on one port) for ddprun agents: many jobs\n"
         "at once, each rerun of a job id in a namespace of its own, finished jobs forgotten.\n\n"
         "Options (dashes and underscores in their names are interchangeable):\n";
  const ServeConfig defaults = serve_defaults();
  for (const ServeFlag& f : kServeFlags) {
    const std::string names = f.value ? std::string(f.name) + " " + f.value : std::string(f.name);
    command_line::print_option(out, names, f.help, f.set.shown() ? f.default_text(defaults) : "");
  }
  command_line::print_option(out, "-h, --help", "show this help (`--help=markdown`: the flags as a Markdown table)");
  command_line::print_option(out, "--version", "print the version");
  out << "\n"
         "The bound address is printed on stdout as \"listening on HOST:PORT\". SIGTERM or SIGINT stop it\n"
         "cleanly.\n\n"
         "status: prints, as JSON, the ddprun jobs whose nodes rendezvous through the store at HOST:PORT\n"
         "(run id, generation, round, state, nodes with their hosts, addresses and heartbeats, worker store,\n"
         "outcome). A protected store needs --token-file (or DDPRUN_TOKEN_FILE): the daemon's secret shows\n"
         "every job, a job token that job alone.\n\n"
         "token: writes the token of job ID, derived from the daemon's secret, to PATH (mode 600) or stdout.\n"
         "Agents given only that token (--rdzv_conf token_file=PATH) can act for that job and no other.\n";
  return out.str();
}

std::string flag_table_markdown() {
  const ServeConfig defaults = serve_defaults();
  std::string out = "| option | default | meaning |\n|---|---|---|\n";
  for (const ServeFlag& f : kServeFlags) {
    const std::string names = "`" + std::string(f.name) + (f.value ? std::string(" ") + f.value : "") + "`";
    out += command_line::markdown_row(
               {names, f.set.shown() ? command_line::markdown_default(f.default_text(defaults)) : f.note, f.help}) +
           "\n";
  }
  return out;
}

}  // namespace ddprun::rdzv::daemon
