#pragma once
// A client of etcd's v3 API through its HTTP/JSON gateway (/v3/kv/range, put, deleterange, txn;
// /v3/lease/grant, keepalive, revoke; /v3/watch; /v3/auth/authenticate), on Boost.Beast with
// OpenSSL for https: no gRPC stack. On the wire keys and values are base64 and int64 fields are
// strings; fields at their default value are left out.
//
// Failover: the endpoints are tried in turn, starting with the last one that answered. A request
// that meets a connection error, a timeout or an "unavailable" answer (a member that lost its
// leader, or is being elected) is sent again to the next endpoint, with a short backoff, until
// the request's deadline. Requests that change state are written so that sending them twice is
// harmless (a put, or a transaction whose compare fails the second time).
//
// Authentication: with a user and password, the client gets a token from /v3/auth/authenticate
// and sends it as the Authorization header; an expired token is renewed once per request.
//
// Thread-safety: an EtcdClient serialises its requests (one connection at a time); a watch has a
// connection of its own, so a thread may block on one while others use the client.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "launcher/rendezvous/etcd/etcd_endpoint.hpp"

namespace ddprun::launcher::rendezvous::etcd {

// An error etcd answered with (a gRPC status code and message), other than unavailability.
class EtcdError : public Error {
 public:
  EtcdError(int code, const std::string& message) : Error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

struct Options {
  // "host:port", "http://host:port" or "https://host:port" (IPv6 as [addr]:port).
  std::vector<std::string> endpoints;
  std::string user;  // etcd authentication (with password)
  std::string password;
  std::string ca_file;    // https: the CA that signed the members' certificates (default: the system's)
  std::string cert_file;  // https: a client certificate and its key, for etcd's --client-cert-auth
  std::string key_file;
  // One attempt's limit (connect, send, answer); a request's overall deadline is its caller's.
  std::chrono::milliseconds attempt_timeout{std::chrono::seconds(3)};
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct RangeResult {
  int64_t revision = 0;  // the store's revision when read
  std::vector<KeyValue> kvs;
  int64_t count = 0;
};

// A transaction's condition: `key`'s create revision, mod revision or value compared for
// equality (a create revision of 0: the key does not exist).
struct Compare {
  enum class Target { Create, Mod, Value } target = Target::Create;
  std::string key;
  int64_t revision = 0;
  std::string value;
  static Compare absent(std::string key) { return {Target::Create, std::move(key), 0, {}}; }
  static Compare value_is(std::string key, std::string value) {
    return {Target::Value, std::move(key), 0, std::move(value)};
  }
};

struct Op {
  enum class Kind { Put, Range, Delete } kind = Kind::Put;
  std::string key;
  std::string value;
  std::string range_end;  // Range, Delete: "" for one key
  int64_t lease = 0;      // Put
  static Op put(std::string key, std::string value, int64_t lease = 0) {
    return {Kind::Put, std::move(key), std::move(value), {}, lease};
  }
  static Op get(std::string key) { return {Kind::Range, std::move(key), {}, {}, 0}; }
  static Op erase(std::string key, std::string range_end = {}) {
    return {Kind::Delete, std::move(key), {}, std::move(range_end), 0};
  }
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  std::vector<RangeResult> ranges;  // the answers of the Range ops that ran, in order
};

struct WatchEvent {
  enum class Type { Put, Delete } type = Type::Put;
  KeyValue kv;
};

// The first key after every key that starts with `prefix` (etcd's range_end for a prefix).
std::string prefix_end(const std::string& prefix);

// Base64 (etcd's encoding of keys and values); decode throws ProtocolError on bad input.
std::string base64_encode(const std::string& bytes);
std::string base64_decode(const std::string& text);

class Connection;
class TlsContext;

// What etcd's members say of its quorum, each asked directly (Client::census).
struct QuorumCensus {
  int members = 0;     // the cluster's (its member list; the endpoints when none gave one)
  int leaderless = 0;  // answered that they have no leader
  int down = 0;        // refused the connection: not running
  int led = 0;         // answered with a leader
  // None can be led: those without a leader or down are a majority, and none has one. Then no
  // lease expires anywhere (leases expire on the leader only), and the next leader gives every
  // lease a fresh TTL as it takes over.
  bool no_quorum() const { return led == 0 && 2 * (leaderless + down) > members; }
  std::string text() const;  // "3 members: 1 without a leader, 2 not running"
};

class Client {
 public:
  // Checks the options (throws ConfigError); connects lazily.
  explicit Client(Options options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  using Deadline = std::chrono::steady_clock::time_point;
  static Deadline after(std::chrono::milliseconds d) { return std::chrono::steady_clock::now() + d; }

  RangeResult range(const std::string& key, const std::string& range_end, Deadline deadline, bool keys_only = false);
  RangeResult get(const std::string& key, Deadline deadline) { return range(key, "", deadline); }
  RangeResult get_prefix(const std::string& prefix, Deadline deadline, bool keys_only = false) {
    return range(prefix, prefix_end(prefix), deadline, keys_only);
  }
  int64_t put(const std::string& key, const std::string& value, int64_t lease, Deadline deadline);
  int64_t erase(const std::string& key, const std::string& range_end, Deadline deadline);
  TxnResult txn(const std::vector<Compare>& compares, const std::vector<Op>& success, const std::vector<Op>& failure,
                Deadline deadline);
  // Creates `key` = `value` unless it exists; returns the key's value either way (so a second,
  // retried attempt of the same creation reads back its own value).
  std::string create_or_get(const std::string& key, const std::string& value, int64_t lease, Deadline deadline);

  // A lease of `ttl` seconds; its ID.
  int64_t lease_grant(std::chrono::seconds ttl, Deadline deadline);
  // One renewal; the lease's remaining TTL in seconds, 0 if it has expired.
  int64_t lease_keepalive(int64_t id, Deadline deadline);
  void lease_revoke(int64_t id, Deadline deadline);
  // Asks every member (its member list's client URLs, else the endpoints) for its status, each
  // for at most `per_member`: answered by a member without a leader, unlike any request that
  // goes through the raft log. For telling etcd without a quorum from etcd out of reach. Never
  // throws: a member that cannot be asked, or answers something else, counts as not answering.
  QuorumCensus census(std::chrono::milliseconds per_member);

  const Options& options() const { return options_; }
  // The endpoints, for messages: "http://10.0.0.1:2379, http://10.0.0.2:2379".
  std::string endpoints_text() const;

  // For watches: the endpoint to try first and the current auth token (empty without auth).
  size_t preferred_endpoint() const;
  std::string token(Deadline deadline);
  void token_rejected(const std::string& token);
  const std::vector<Endpoint>& endpoints() const { return endpoints_; }
  TlsContext* tls() const { return tls_.get(); }

 private:
  // POSTs `body` (JSON) to `path`, failing over across the members until `deadline`; returns the
  // answer, a JSON object. A member that answers anything else (a proxy's HTML page, a wrong port)
  // counts as failed; the start of its answer is in the error at the deadline. Called with mutex_
  // held; `anonymous`: without the auth token.
  nlohmann::json call(const std::string& path, const std::string& body, Deadline deadline, bool anonymous = false);
  std::string authenticate(Deadline deadline);

  Options options_;
  std::vector<Endpoint> endpoints_;
  std::unique_ptr<TlsContext> tls_;
  mutable std::mutex mutex_;  // one request at a time
  std::unique_ptr<Connection> conn_;
  size_t current_ = 0;
  std::string token_;
  std::mutex token_mutex_;
};

// One watch stream on a key or a range, from a revision on. next() returns the events that
// arrive within a timeout; a broken stream (its member went away) is opened again on the next
// endpoint from the revision after the last event seen, so no event is lost or repeated.
class Watch {
 public:
  // Watches [key, range_end) (range_end empty: the key alone) from start_revision. `present`: the
  // keys the caller saw there at start_revision - 1, so that a watch whose history etcd has
  // compacted away can still report what changed (see next()).
  Watch(Client& client, std::string key, std::string range_end, int64_t start_revision,
        std::vector<std::string> present = {});
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  // Events that arrived within `timeout` (empty if none). Throws ConnectionError when no
  // endpoint will serve the watch until `give_up` passes, EtcdError if etcd refuses it. When the
  // revision to resume from has been compacted (a member failed over hours after the last event),
  // the range is read afresh instead and the difference reported as events: a PUT for each key
  // changed since, a DELETE for each key gone; only intermediate values are lost.
  std::vector<WatchEvent> next(std::chrono::milliseconds timeout, Client::Deadline give_up);
  int64_t next_revision() const { return next_revision_; }

 private:
  bool open(Client::Deadline deadline);
  std::vector<WatchEvent> resync(int64_t compacted, Client::Deadline deadline);

  Client& client_;
  std::string key_, range_end_;
  int64_t next_revision_;
  std::unique_ptr<Connection> conn_;
  size_t endpoint_ = 0;
  std::string pending_;            // bytes of a message not complete yet
  std::set<std::string> present_;  // keys in the range as of next_revision_ - 1
};

}  // namespace ddprun::launcher::rendezvous::etcd
