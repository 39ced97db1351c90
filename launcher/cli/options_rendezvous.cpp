// How the nodes find each other: the rows of --rdzv_backend, --rdzv_endpoint and --rdzv_conf (the
// flag table is flags.cpp), and the table of --rdzv_conf keys: each key's spellings, meaning and what
// its value does, in one place.
#include <algorithm>
#include <string_view>

#include "common/host_port.hpp"
#include "launcher/rendezvous/etcd/etcd_endpoint.hpp"
#include "launcher/cli/flags.hpp"
#include "launcher/cli/options_parse.hpp"

namespace ddprun::launcher::cli {

namespace etcd = rendezvous::etcd;
namespace {

using options::OptionInput;
using options::seconds;
using options::text;
using options::whole;
using options_detail::bad_value;
using options_detail::lower;
using options_detail::parse_bool;
using options_detail::parse_seconds;
using options_detail::parse_whole;

// Every --rdzv_conf key torchrun 2.x accepts, and ddprun's own, in --help order.
constexpr RdzvConfKey kRdzvConfKeys[] = {
    {"join_timeout", "timeout", nullptr, "seconds a rendezvous may take before the node gives up",
     seconds<&LaunchOptions::rdzv_timeouts, &rendezvous::Timeouts::join_timeout>(false)},
    {"last_call_timeout", "", nullptr, "seconds an elastic rendezvous waits for more nodes once it has `--nnodes` MIN",
     seconds<&LaunchOptions::rdzv_timeouts, &rendezvous::Timeouts::last_call_timeout>(false)},
    {"quorum_join_timeout", "", nullptr,
     "replica groups: seconds a quorum waits for heartbeating groups that have not asked yet before it goes on "
     "without them",
     seconds<&LaunchOptions::quorum_join_timeout>(true)},
    {"quorum_heartbeat_timeout", "", nullptr,
     "replica groups: seconds without a heartbeat after which a group no longer counts for the quorum (a group "
     "whose workers died is out at once)",
     seconds<&LaunchOptions::quorum_heartbeat_timeout>(false)},
    {"keep_alive_interval", "", nullptr, "seconds between a node's keep-alives",
     seconds<&LaunchOptions::rdzv_timeouts, &rendezvous::Timeouts::keep_alive_interval>(false)},
    {"keep_alive_max_attempt", "", nullptr, "missed keep-alives after which a node is lost",
     whole<&LaunchOptions::rdzv_timeouts, &rendezvous::Timeouts::keep_alive_max_attempt>(1, 1000, "a count >= 1")},
    {"heartbeat_timeout", "", nullptr,
     "seconds without keep-alives after which a node is lost: sets `keep_alive_max_attempt` to as many "
     "intervals as fit",
     [](const OptionInput& in, LaunchOptions& o) { o.heartbeat_timeout = parse_seconds(in.flag, in.text, false); }},
    {"read_timeout", "", nullptr,
     "seconds one request to the rendezvous store may take (torchrun: the c10d backend's store reads)",
     seconds<&LaunchOptions::rdzv_timeouts, &rendezvous::Timeouts::read_timeout>(false)},
    {"store_reconnect_timeout", "", nullptr,
     "seconds a node keeps reconnecting to its rendezvous store (a `ddprun-rendezvous`, or node 0's ddprun) "
     "after losing it, or after a request got no reply (a partition, a frozen host), before the job fails; "
     "`0` fails at once. A store without `--state-file` that refuses the reconnection has ended and is not "
     "waited for",
     seconds<&LaunchOptions::rdzv_timeouts, &rendezvous::Timeouts::store_reconnect_timeout>(true), "", nullptr, false,
     "[Partitions](multi-node.md#partitions-and-frozen-hosts) and "
     "[Restarting the daemon](operations.md#restarting-the-daemon-without-ending-jobs)"},
    {"is_host", "", nullptr,
     "with `c10d`: whether this node hosts the store at `--rdzv_endpoint`; `false` makes it a client (of another "
     "node or a daemon); `true` makes a port already taken an error",
     [](const OptionInput& in, LaunchOptions& o) { o.rdzv_is_host = parse_bool(in.flag, in.text); },
     "when the endpoint is one of this host's names or addresses"},
    {"close_timeout", "", nullptr,
     "accepted and checked (a number of seconds): torchrun's wait for a closing round; ddprun's rounds close "
     "at once",
     [](const OptionInput& in, LaunchOptions&) { parse_seconds(in.flag, in.text, false); }},
    {"store_type", "", nullptr,
     "accepted when `tcp`: the rendezvous store is ddprun's TCP store; torchrun's `file` store has no "
     "counterpart (error)",
     [](const OptionInput& in, LaunchOptions&) {
       if (lower(in.text) != "tcp") {
         bad_value(in.flag,
                   "'tcp' (ddprun's rendezvous store is its TCPStore; torchrun's store_type=file has no "
                   "counterpart)",
                   in.text);
       }
     },
     "`tcp`"},
    {"use_libuv", "", nullptr,
     "accepted and checked (a boolean): torchrun's choice of its store's event loop; the rendezvous store is "
     "ddprun's own",
     [](const OptionInput& in, LaunchOptions&) { parse_bool(in.flag, in.text); }, "", nullptr, false,
     "[the Python hook](#pytorch-2x-and-debian-13) for the workers' client"},
    {"rank", "", nullptr, "the node's rank, as `--node_rank` (both given and different: an error)",
     [](const OptionInput& in, LaunchOptions& o) {
       const int rank = static_cast<int>(parse_whole(in.flag, in.text, 0, o.max_nodes - 1, "a node rank"));
       if (o.node_rank_given && rank != o.node_rank) {
         throw ConfigError(in.flag + " is " + in.text + " but --node_rank is " + std::to_string(o.node_rank) +
                           ": keep one");
       }
       o.node_rank = rank;
       o.node_rank_given = true;
     }},
    {"token_file", "", nullptr, "the rendezvous store's secret or this job's token (also `DDPRUN_TOKEN_FILE`)",
     [](const OptionInput& in, LaunchOptions& o) {
       if (in.text.empty()) bad_value(in.flag, "the path of a file holding the secret", in.text);
       o.token_file = in.text;
     },
     "", nullptr, false, "[the threat model](multi-node.md#who-may-talk-to-a-store-the-threat-model)"},
    {"key_prefix",
     "etcd_prefix",
     nullptr,
     "etcd: the prefix of the job's keys",
     {[](const OptionInput& in, LaunchOptions& o) {
        if (in.text.empty()) bad_value(in.flag, "a key prefix such as /ddprun/", in.text);
        o.etcd.prefix = in.text.back() == '/' ? in.text : in.text + "/";
      },
      [](const LaunchOptions& d) { return d.etcd.prefix; }},
     "",
     nullptr,
     false,
     nullptr,
     true},
    {"lease_ttl",
     "",
     nullptr,
     "etcd: seconds of the agents' leases",
     {[](const OptionInput& in, LaunchOptions& o) {
        o.etcd.lease_ttl = std::chrono::seconds(parse_whole(in.flag, in.text, 2, 3600, "whole seconds from 2 to 3600"));
      },
      [](const LaunchOptions& d) { return std::to_string(d.etcd.lease_ttl.count()); }},
     "",
     nullptr,
     false,
     nullptr,
     true},
    {"etcd_user", "", nullptr, "etcd: user name (needs `etcd_password_file`)",
     text<&LaunchOptions::etcd, &LaunchOptions::Etcd::user>(false), "", nullptr, false, nullptr, true},
    {"etcd_password_file", "", nullptr, "etcd: the file holding the password",
     text<&LaunchOptions::etcd, &LaunchOptions::Etcd::password_file>(false), "", nullptr, false, nullptr, true},
    {"etcd_ca_file", "cacert,ca_cert", nullptr, "etcd: CA certificate (PEM)",
     text<&LaunchOptions::etcd, &LaunchOptions::Etcd::ca_file>(false), "", nullptr, false, nullptr, true},
    {"etcd_cert_file", "cert,ssl_cert", nullptr, "etcd: client certificate (PEM)",
     text<&LaunchOptions::etcd, &LaunchOptions::Etcd::cert_file>(false), "", nullptr, false, nullptr, true},
    {"etcd_key_file", "key,ssl_cert_key", nullptr, "etcd: client key (PEM)",
     text<&LaunchOptions::etcd, &LaunchOptions::Etcd::key_file>(false), "", nullptr, false, nullptr, true},
    {"protocol", "", nullptr, "etcd: `http` or `https` for endpoints given without a scheme",
     [](const OptionInput& in, LaunchOptions& o) {
       if (in.text != "http" && in.text != "https") bad_value(in.flag, "http or https", in.text);
       // torchrun's etcd backends: the scheme of endpoints given without one.
       for (std::string& e : o.etcd.endpoints) {
         if (e.find("://") == std::string::npos) e = in.text + "://" + e;
       }
     },
     "", nullptr, false, nullptr, true},
};

}  // namespace

std::span<const RdzvConfKey> rdzv_conf_keys() { return kRdzvConfKeys; }

const RdzvConfKey* find_rdzv_conf_key(const std::string& spelled) {
  for (const RdzvConfKey& k : kRdzvConfKeys) {
    if (k.named(spelled)) return &k;
  }
  return nullptr;
}

namespace {

// Optimal string alignment distance (Levenshtein with adjacent transpositions: "jion" is 1 from "join").
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string nearest_rdzv_conf_key(const std::string& spelled) {
  // Up to 2 edits for names of 6 characters or more, 1 below ("rank" vs "rnak"), never 0.
  const size_t limit = spelled.size() >= 6 ? 2 : 1;
  std::string best;
  size_t best_distance = limit + 1;
  auto consider = [&](std::string_view name) {
    const size_t d = edit_distance(spelled, name);
    if (d > 0 && d < best_distance) {
      best_distance = d;
      best = std::string(name);
    }
  };
  for (const RdzvConfKey& k : kRdzvConfKeys) {
    k.any_name([&](std::string_view n) {
      consider(n);
      return false;
    });
  }
  return best;
}

namespace options_detail {

void apply_rdzv_backend(const FlagInput& in, LaunchOptions& o) {
  const std::string v = trim(in.text);
  if (v == "static") {
    o.rdzv_backend = RdzvBackend::Static;
  } else if (v == "c10d") {
    o.rdzv_backend = RdzvBackend::C10d;
  } else if (v == "etcd") {
    o.rdzv_backend = RdzvBackend::Etcd;
  } else if (v == "etcd-v2") {
    throw ConfigError(in.flag +
                      " etcd-v2: that is torchrun's backend for etcd's v2 API, which etcd 3.4 disables "
                      "and 3.6 removed; ddprun speaks etcd's v3 API: use --rdzv_backend etcd");
  } else {
    throw ConfigError(in.flag +
                      ": expected 'static' (fixed --node_rank per node), 'c10d' (nodes join "
                      "--rdzv_endpoint without ranks, --nnodes MIN:MAX) or 'etcd' (the same through an etcd v3 "
                      "cluster), got '" +
                      v + "'");
  }
}

namespace {

// --rdzv_backend etcd: host:port[,host:port...], each optionally http:// or https://
void parse_etcd_endpoints(const std::string& flag, LaunchOptions& o) {
  for (const std::string& e : split(o.rdzv_endpoint, ',')) {
    if (e.empty()) continue;
    try {
      etcd::parse_endpoint(e);
    } catch (const ConfigError& err) {
      throw ConfigError(flag + ": " + err.what());
    }
    o.etcd.endpoints.push_back(e);
  }
}

// The store's address: host, host:port, [v6], [v6]:port, or a bare IPv6 address (common/host_port.hpp).
void parse_store_endpoint(const std::string& flag, LaunchOptions& o) {
  std::string why;
  const auto ep = parse_host_port(o.rdzv_endpoint, &why);
  if (!ep)
    bad_value(flag, "host[:port] or [ipv6]:port with a port from 1 to 65535 (here: " + why + ")", o.rdzv_endpoint);
  o.rdzv_endpoint_host = ep->host;
  if (ep->port) o.rdzv_endpoint_port = *ep->port;
}

}  // namespace

void apply_rdzv_endpoint(const FlagInput& in, LaunchOptions& o) {
  if (trim(in.text).empty()) return;
  o.rdzv_endpoint = trim(in.text);
  if (o.rdzv_backend == RdzvBackend::Etcd) {
    parse_etcd_endpoints(in.flag, o);
  } else {
    parse_store_endpoint(in.flag, o);
  }
}

// --rdzv_conf KEY=VALUE,...: each key through its entry of the table.
void apply_rdzv_conf(const FlagInput& in, LaunchOptions& o) {
  std::string text = trim(in.text);
  // "'k1=v1,k2=v2'": quotes a shell would have removed (PyTorch's own tests pass the value so, and a
  // Kubernetes manifest can): the keys are inside them.
  if (text.size() >= 2 && (text.front() == '\'' || text.front() == '"') && text.back() == text.front()) {
    text = trim(text.substr(1, text.size() - 2));
  }
  if (text.empty()) return;
  for (const std::string& kv : split(text, ',')) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) bad_value(in.flag, "key=value pairs separated by commas", kv);
    o.rdzv_conf[trim(kv.substr(0, eq))] = trim(kv.substr(eq + 1));
  }
  for (const auto& [k, v] : o.rdzv_conf) {
    const RdzvConfKey* key = find_rdzv_conf_key(k);
    if (key == nullptr) {
      // A near miss of a known key is a typo (an error); anything else torchrun ignores too.
      const std::string near = nearest_rdzv_conf_key(k);
      if (near.empty()) {
        o.ignored_rdzv_conf.push_back(k);
        continue;
      }
      std::string known;
      for (const RdzvConfKey& c : rdzv_conf_keys()) known += (known.empty() ? "" : ", ") + std::string(c.name);
      throw ConfigError(in.flag + ": unknown key '" + k + "': did you mean '" + near + "'? (known: " + known + ")");
    }
    if (key->etcd_only && o.rdzv_backend != RdzvBackend::Etcd) {
      throw ConfigError(in.flag + " " + k + ": an etcd setting, but the rendezvous backend is '" +
                        rdzv_backend_name(o.rdzv_backend) + "' (add --rdzv_backend etcd, or drop " + k + ")");
    }
    const std::string where = in.flag + " " + k;
    key->set.apply(options::OptionInput{where, v}, o);
  }
  if (o.heartbeat_timeout) {
    // A node is lost after keep_alive_max_attempt missed keep-alives: as many as fit in the timeout.
    const auto n = (o.heartbeat_timeout->count() + o.rdzv_timeouts.keep_alive_interval.count() - 1) /
                   o.rdzv_timeouts.keep_alive_interval.count();
    o.rdzv_timeouts.keep_alive_max_attempt = static_cast<int>(std::clamp<long long>(n, 1, 1000));
  }
  if (!o.etcd.user.empty() && o.etcd.password_file.empty()) {
    throw ConfigError(in.flag + ": etcd_user needs etcd_password_file=PATH (a file only you can read)");
  }
}

}  // namespace options_detail
}  // namespace ddprun::launcher::cli
