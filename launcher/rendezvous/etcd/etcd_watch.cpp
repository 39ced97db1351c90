// A watch of a key range: etcd's streaming /v3/watch, resumed on another member (and past a
// compaction) without losing a change (etcd_client.hpp).
#include "launcher/rendezvous/etcd/etcd_wire.hpp"

#include <thread>

namespace ddprun::launcher::rendezvous::etcd {

namespace {

// The longest watch message a member may send: etcd's own are far smaller (its request limit is
// 1.5 MiB by default).
constexpr size_t kMostWatchMessage = size_t{64} << 20;

}  // namespace

Watch::Watch(Client& client, std::string key, std::string range_end, int64_t start_revision,
             std::vector<std::string> present)
    : client_(client),
      key_(std::move(key)),
      range_end_(std::move(range_end)),
      next_revision_(start_revision),
      present_(present.begin(), present.end()) {
  endpoint_ = client_.preferred_endpoint();
}

std::vector<WatchEvent> Watch::resync(int64_t compacted, Client::Deadline deadline) {
  const RangeResult now = client_.range(key_, range_end_, deadline);
  log::warn("ddprun") << "etcd compacted its history past this watch (it resumes at revision " << next_revision_
                      << ", the oldest kept is " << compacted << "): read the keys afresh at revision " << now.revision;
  std::vector<WatchEvent> events;
  std::set<std::string> seen;
  for (const KeyValue& kv : now.kvs) {
    seen.insert(kv.key);
    if (kv.mod_revision >= next_revision_ || present_.count(kv.key) == 0) {
      WatchEvent ev;
      ev.type = WatchEvent::Type::Put;
      ev.kv = kv;
      events.push_back(std::move(ev));
    }
  }
  for (const std::string& k : present_) {
    if (seen.count(k) != 0) continue;
    WatchEvent ev;
    ev.type = WatchEvent::Type::Delete;
    ev.kv.key = k;
    ev.kv.mod_revision = now.revision;
    events.push_back(std::move(ev));
  }
  present_ = std::move(seen);
  next_revision_ = now.revision + 1;
  return events;
}

Watch::~Watch() = default;

bool Watch::open(Client::Deadline deadline) {
  const auto& eps = client_.endpoints();
  // progress_notify: an idle watch still learns how far etcd's history has gone (every 10 minutes
  // by default), so that resuming it elsewhere seldom needs a compacted revision.
  json create = {
      {"key", base64_encode(key_)}, {"start_revision", std::to_string(next_revision_)}, {"progress_notify", true}};
  if (!range_end_.empty()) create["range_end"] = base64_encode(range_end_);
  const std::string body = json{{"create_request", create}}.dump();
  for (size_t i = 0; i < eps.size(); ++i) {
    const Endpoint& ep = eps[endpoint_];
    try {
      const std::string token = client_.token(deadline);
      auto conn = std::make_unique<Connection>(ep, client_.tls());
      const auto attempt = std::min(deadline, Clock::now() + client_.options().attempt_timeout);
      conn->connect(attempt);
      const int status = conn->start_stream("/v3/watch", body, token, attempt);
      if (status == 401 && !token.empty()) client_.token_rejected(token);
      if (status == 200) {
        conn_ = std::move(conn);
        pending_.clear();
        return true;
      }
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      DDPRUN_LOG_DEBUG("ddprun") << "etcd watch on " << ep.text << ": " << e.what();
    }
    endpoint_ = (endpoint_ + 1) % eps.size();
  }
  return false;
}

std::vector<WatchEvent> Watch::next(std::chrono::milliseconds timeout, Client::Deadline give_up) {
  const auto until = Clock::now() + timeout;
  std::vector<WatchEvent> events;
  for (;;) {
    if (!conn_) {
      if (!open(std::max(until, std::min(give_up, Clock::now() + client_.options().attempt_timeout)))) {
        if (Clock::now() >= give_up) {
          throw ConnectionError("no etcd member (" + client_.endpoints_text() + ") serves a watch");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // sleep override: every member refused; retry
        if (Clock::now() >= until) return events;
        continue;
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    const size_t scanned = pending_.size();  // holds no newline
    try {
      pending_ += conn_->read_stream(std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception& e) {
      // The member went away (or closed the stream): reopen on the next one from where we were.
      DDPRUN_LOG_DEBUG("ddprun") << "etcd watch: " << e.what() << "; reopening";
      conn_.reset();
      endpoint_ = (endpoint_ + 1) % client_.endpoints().size();
      if (Clock::now() >= until) return events;
      continue;
    }
    if (pending_.find('\n', scanned) == std::string::npos) {
      // No message ended: only the new bytes are looked at (a message sent slowly costs its length,
      // not its length squared), and a message longer than any etcd sends is that member's fault.
      if (pending_.size() > kMostWatchMessage) {
        log::warn("ddprun") << "etcd at " << client_.endpoints()[endpoint_].text << " sent "
                            << pending_.size() / (1 << 20)
                            << " MiB on its watch stream without ending a message (etcd's are far smaller): taken "
                               "for a failed member, the watch resumes on the next one";
        conn_.reset();
        pending_.clear();
        endpoint_ = (endpoint_ + 1) % client_.endpoints().size();
      }
      if (Clock::now() >= until) return events;
      continue;
    }
    for (auto nl = pending_.find('\n'); nl != std::string::npos; nl = pending_.find('\n')) {
      const std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      const json j = json::parse(line, nullptr, false);
      if (!j.is_object()) throw ProtocolError("etcd sent a watch message that is not JSON: " + printable_start(line));
      if (j.contains("error")) {
        auto [code, message] = error_of(line, 0);
        if (code == kUnauthenticated) {
          conn_.reset();
          client_.token_rejected(client_.token(give_up));
          break;
        }
        if (transient(code, message)) {
          conn_.reset();
          break;
        }
        throw EtcdError(code, "etcd watch: " + message);
      }
      const json& r = j.contains("result") ? j["result"] : j;
      if (bool_field(r, "canceled")) {
        const int64_t compacted = int64_of(r, "compact_revision");
        if (compacted > 0) {
          conn_.reset();
          for (auto& ev : resync(compacted, std::max(give_up, Clock::now() + client_.options().attempt_timeout))) {
            events.push_back(std::move(ev));
          }
          break;
        }
        const std::string reason = string_field(r, "cancel_reason");
        throw EtcdError(11, "etcd canceled the watch" + (reason.empty() ? std::string() : ": " + reason));
      }
      const auto evs = r.find("events");
      if (evs != r.end() && evs->is_array() && !evs->empty()) {
        for (const json& e : *evs) {
          WatchEvent ev;
          ev.type = string_field(e, "type", "PUT") == "DELETE" ? WatchEvent::Type::Delete : WatchEvent::Type::Put;
          if (auto kv = e.find("kv"); kv != e.end()) ev.kv = kv_of(*kv);
          next_revision_ = std::max(next_revision_, ev.kv.mod_revision + 1);
          if (ev.type == WatchEvent::Type::Put) present_.insert(ev.kv.key);
          else present_.erase(ev.kv.key);
          events.push_back(std::move(ev));
        }
      } else if (!bool_field(r, "created")) {
        // A progress notification: etcd sends one only to a watch that has every event up to its
        // header's revision.
        if (auto hdr = r.find("header"); hdr != r.end()) {
          next_revision_ = std::max(next_revision_, int64_of(*hdr, "revision") + 1);
        }
      }
    }
    if (!events.empty() || Clock::now() >= until) return events;
  }
}

}  // namespace ddprun::launcher::rendezvous::etcd
