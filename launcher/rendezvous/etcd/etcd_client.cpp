// etcd's v3 gateway, one request at a time, failing over across members (etcd_client.hpp).
#include "launcher/rendezvous/etcd/etcd_wire.hpp"

namespace ddprun::launcher::rendezvous::etcd {

Client::Client(Options options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw ConfigError("no etcd endpoint: give --rdzv_endpoint host:port[,host:port...]");
  bool tls = false;
  for (const std::string& e : options_.endpoints) {
    endpoints_.push_back(parse_endpoint(e));
    tls = tls || endpoints_.back().tls;
  }
  if (!options_.user.empty() && options_.password.empty()) {
    throw ConfigError("etcd user '" + options_.user + "' needs a password (--rdzv_conf etcd_password_file=PATH)");
  }
  if (tls) tls_ = std::make_unique<TlsContext>(options_);
}

Client::~Client() { conn_.reset(); }

std::string Client::endpoints_text() const {
  std::string out;
  for (const auto& e : endpoints_) out += (out.empty() ? "" : ", ") + e.text;
  return out;
}

size_t Client::preferred_endpoint() const {
  std::lock_guard lock(mutex_);
  return current_;
}

std::string Client::authenticate(Deadline deadline) {
  const json body = {{"name", options_.user}, {"password", options_.password}};
  const json j = call("/v3/auth/authenticate", body.dump(), deadline, /*anonymous=*/true);
  if (!j.contains("token") || !j["token"].is_string()) {
    throw ProtocolError("etcd's authenticate answer has no token");
  }
  return j["token"].get<std::string>();
}

std::string Client::token(Deadline deadline) {
  if (options_.user.empty()) return "";
  std::lock_guard lock(mutex_);
  if (token_.empty()) token_ = authenticate(deadline);
  return token_;
}

void Client::token_rejected(const std::string& token) {
  std::lock_guard lock(mutex_);
  if (token_ == token) token_.clear();
}

json Client::call(const std::string& path, const std::string& body, Deadline deadline, bool anonymous) {
  std::string last_error = "no attempt was made before the deadline";
  auto backoff = std::chrono::milliseconds(50);
  bool renewed_token = false;
  size_t tried = 0;
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline && tried > 0) {
      throw ConnectionError("etcd (" + endpoints_text() + ") did not answer " + path +
                            " in time; last error: " + last_error);
    }
    const Endpoint& ep = endpoints_[current_];
    ++tried;
    try {
      const auto attempt_deadline = std::min(deadline, now + options_.attempt_timeout);
      if (!anonymous && !options_.user.empty() && token_.empty()) token_ = authenticate(deadline);
      if (!conn_ || !conn_->is_open()) {
        conn_ = std::make_unique<Connection>(ep, tls_.get());
        conn_->connect(attempt_deadline);
      }
      auto [status, text] = conn_->post(path, body, anonymous ? "" : token_, attempt_deadline);
      if (status == 200) {
        json j = json::parse(text, nullptr, false);
        if (j.is_object()) return j;
        throw ProtocolError(
            ep.text + " answered " + path +
            " with something other than etcd's JSON (is this etcd's client port?): " + printable_start(text));
      }
      auto [code, message] = error_of(text, status);
      if (code == kUnauthenticated && !anonymous && !options_.user.empty() && !renewed_token) {
        token_.clear();  // expired: one new token, then the request again
        renewed_token = true;
        continue;
      }
      if (!transient(code, message)) throw EtcdError(code, "etcd at " + ep.text + ": " + message);
      last_error = ep.text + ": " + message;
    } catch (const EtcdError&) {
      throw;
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      last_error = e.what();
      conn_.reset();
    }
    // The next member, after a short pause (a leader election takes about a second).
    current_ = (current_ + 1) % endpoints_.size();
    conn_.reset();
    const auto pause = std::min<Clock::duration>(backoff, deadline - Clock::now());
    if (pause > Clock::duration::zero()) std::this_thread::sleep_for(pause);  // sleep override: backoff between members
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

RangeResult Client::range(const std::string& key, const std::string& range_end, Deadline deadline, bool keys_only) {
  json body = {{"key", base64_encode(key)}};
  if (!range_end.empty()) body["range_end"] = base64_encode(range_end);
  if (keys_only) body["keys_only"] = true;
  std::lock_guard lock(mutex_);
  return range_of(call("/v3/kv/range", body.dump(), deadline));
}

int64_t Client::put(const std::string& key, const std::string& value, int64_t lease, Deadline deadline) {
  json body = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease) body["lease"] = std::to_string(lease);
  std::lock_guard lock(mutex_);
  const json j = call("/v3/kv/put", body.dump(), deadline);
  return j.contains("header") ? int64_of(j["header"], "revision") : 0;
}

int64_t Client::erase(const std::string& key, const std::string& range_end, Deadline deadline) {
  json body = {{"key", base64_encode(key)}};
  if (!range_end.empty()) body["range_end"] = base64_encode(range_end);
  std::lock_guard lock(mutex_);
  return int64_of(call("/v3/kv/deleterange", body.dump(), deadline), "deleted");
}

TxnResult Client::txn(const std::vector<Compare>& compares, const std::vector<Op>& success,
                      const std::vector<Op>& failure, Deadline deadline) {
  json cmp = json::array();
  for (const Compare& c : compares) {
    json x = {{"key", base64_encode(c.key)}, {"result", "EQUAL"}};
    switch (c.target) {
      case Compare::Target::Create:
        x["target"] = "CREATE";
        x["create_revision"] = std::to_string(c.revision);
        break;
      case Compare::Target::Mod:
        x["target"] = "MOD";
        x["mod_revision"] = std::to_string(c.revision);
        break;
      case Compare::Target::Value:
        x["target"] = "VALUE";
        x["value"] = base64_encode(c.value);
        break;
    }
    cmp.push_back(std::move(x));
  }
  json ok = json::array(), ko = json::array();
  for (const Op& op : success) ok.push_back(op_json(op));
  for (const Op& op : failure) ko.push_back(op_json(op));
  const json body = {{"compare", cmp}, {"success", ok}, {"failure", ko}};
  std::lock_guard lock(mutex_);
  const json j = call("/v3/kv/txn", body.dump(), deadline);
  TxnResult r;
  r.succeeded = bool_field(j, "succeeded");
  if (j.contains("header")) r.revision = int64_of(j["header"], "revision");
  if (auto resp = j.find("responses"); resp != j.end() && resp->is_array()) {
    for (const json& x : *resp) {
      if (auto rr = x.find("response_range"); rr != x.end()) r.ranges.push_back(range_of(*rr));
    }
  }
  return r;
}

std::string Client::create_or_get(const std::string& key, const std::string& value, int64_t lease, Deadline deadline) {
  // Another client's key can be deleted between our compare and our read (its lease expired):
  // then try again, until the deadline.
  for (;;) {
    const TxnResult r = txn({Compare::absent(key)}, {Op::put(key, value, lease)}, {Op::get(key)}, deadline);
    if (r.succeeded) return value;
    if (!r.ranges.empty() && !r.ranges[0].kvs.empty()) return r.ranges[0].kvs[0].value;
    if (Clock::now() >= deadline) {
      throw ConnectionError("etcd: " + key +
                            " was neither created nor readable before the deadline (deleted each time"
                            " it was read)");
    }
  }
}

int64_t Client::lease_grant(std::chrono::seconds ttl, Deadline deadline) {
  const json body = {{"TTL", std::to_string(ttl.count())}};
  std::lock_guard lock(mutex_);
  const json j = call("/v3/lease/grant", body.dump(), deadline);
  const int64_t id = int64_of(j, "ID");
  if (id == 0) throw ProtocolError("etcd granted a lease without an ID: " + j.dump().substr(0, 200));
  return id;
}

int64_t Client::lease_keepalive(int64_t id, Deadline deadline) {
  const json body = {{"ID", std::to_string(id)}};
  std::lock_guard lock(mutex_);
  const json j = call("/v3/lease/keepalive", body.dump(), deadline);
  // A stream of one answer: {"result": {"ID": ..., "TTL": ...}}; no TTL: the lease is gone.
  const json& r = j.contains("result") ? j["result"] : j;
  return int64_of(r, "TTL");
}

void Client::lease_revoke(int64_t id, Deadline deadline) {
  const json body = {{"ID", std::to_string(id)}};
  std::lock_guard lock(mutex_);
  try {
    call("/v3/lease/revoke", body.dump(), deadline);
  } catch (const EtcdError& e) {
    if (e.code() != kNotFound) throw;  // expired already
  }
}

std::string QuorumCensus::text() const {
  return std::to_string(members) + " member(s): " + std::to_string(leaderless) + " without a leader, " +
         std::to_string(down) + " not running, " + std::to_string(led) + " led, " +
         std::to_string(members - leaderless - down - led) + " not answering";
}

QuorumCensus Client::census(std::chrono::milliseconds per_member) {
  // The auth token as it stands (none while a request holds the client: it may be waiting on a
  // member that does not answer).
  std::string token;
  if (std::unique_lock lock(mutex_, std::try_to_lock); lock.owns_lock()) token = token_;
  // One short request to one member, on a connection of its own (the client's may be waiting on
  // a member that does not answer). Its answer, or nullopt; `refused` when nothing listens there.
  const auto ask = [&](const Endpoint& ep, const std::string& path, bool& refused) -> std::optional<json> {
    if (ep.tls && !tls_) return std::nullopt;  // a member listed at https, none given: not asked
    Connection c(ep, tls_.get());
    try {
      const auto deadline = Clock::now() + per_member;
      c.connect(deadline);
      auto [status, text] = c.post(path, "{}", token, deadline);
      json j = json::parse(text, nullptr, false);
      if (status == 200 && j.is_object()) return j;
    } catch (const ConfigError&) {
    } catch (const std::exception&) {
      refused = c.refused();
    }
    return std::nullopt;
  };
  // The members, from the first endpoint that lists them (a member lists them without a leader).
  std::vector<Endpoint> members;
  for (const Endpoint& ep : endpoints_) {
    bool refused = false;
    const auto list = ask(ep, "/v3/cluster/member/list", refused);
    if (!list || !list->contains("members") || !(*list)["members"].is_array()) continue;
    for (const json& m : (*list)["members"]) {
      const auto urls = m.find("clientURLs");
      if (urls == m.end() || !urls->is_array() || urls->empty() || !urls->front().is_string()) continue;
      try {
        members.push_back(parse_endpoint(urls->front().get<std::string>()));
      } catch (const ConfigError&) {
      }
    }
    if (!members.empty()) break;
  }
  if (members.empty()) members = endpoints_;
  QuorumCensus c;
  c.members = static_cast<int>(members.size());
  for (const Endpoint& ep : members) {
    bool refused = false;
    const auto status = ask(ep, "/v3/maintenance/status", refused);
    if (!status) {
      c.down += refused ? 1 : 0;
    } else if (const auto leader = status->find("leader");
               leader != status->end() && leader->is_string() && *leader != "0" && *leader != "") {
      ++c.led;  // a member id: a uint64, as a string
    } else {
      ++c.leaderless;  // "errors": ["etcdserver: no leader"]
    }
  }
  return c;
}

}  // namespace ddprun::launcher::rendezvous::etcd
