#pragma once
// Who may talk to a protected store, and how they prove it, without ever sending a secret.
//
// Secrets. A daemon (or node 0's store) is protected by a cluster secret, read from a token file.
// A job's key is derived from it: HMAC-SHA256(cluster secret, "ddprun-job-v1 " + run id). So:
//   - whoever holds the cluster secret may act for any job (the daemon's operator, trusted agents);
//   - whoever holds only a job token (the job key, written to a file by `ddprun-rendezvous token`)
//     may act for that job alone, and cannot derive another job's key.
//
// The handshake, an extension of the TCPStore protocol's 2.x dialect (opcodes well above
// PyTorch's, so PyTorch clients never send them). A ddprun client sends, right after VALIDATE and
// PING:
//   AUTH_HELLO  u32 version | str scope | bytes client_nonce(32)  -> u8 mode | bytes server_nonce
// mode 0: the store is open (no secret needed, as for PyTorch clients); mode 1 or 2: prove it:
//   AUTH_PROOF  bytes mac(32)                                      -> u8 0 | bytes server_mac(32)
// A store that answers mode 2 says a refused proof (u8 1) before it closes the connection, so that
// its clients tell a refused secret from a connection lost mid-handshake (a partition); after mode
// 1 (older stores) a close is the refusal.
// mac = HMAC(key, "ddprun-auth-v1 client" | scope | client_nonce | server_nonce), server_mac the
// same with "server": each side proves it holds the key, for fresh nonces, so a captured exchange
// replays nothing and an impostor store is detected. scope is a run id (key: that job's key) or "*"
// (key: the cluster secret). A wrong proof closes the connection. Once authenticated, a
// connection may touch only its scope's keys (/ddprun/<run id>/...); "*" may touch every key.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace ddprun::rdzv::core {

inline constexpr uint32_t kAuthVersion = 1;
inline constexpr uint8_t kAuthOpen = 0;
inline constexpr uint8_t kAuthProve = 1;             // a refused proof is a close
inline constexpr uint8_t kAuthProveSaysRefusal = 2;  // a refused proof is u8 1, then a close
inline constexpr uint8_t kProofAccepted = 0;
inline constexpr uint8_t kProofRefused = 1;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr std::string_view kAllJobs = "*";

// What a client proves it holds: the key for `scope`.
struct Credentials {
  std::string scope;  // a run id, or "*"
  std::string key;    // the job key for a run id; the cluster secret for "*"
};

// HMAC-SHA256 (OpenSSL's libcrypto).
std::string hmac_sha256(std::string_view key, std::string_view data);
// A job's key from the cluster secret. A replica group's world ("<job>.rg<group>", ddprun
// --replica_group) has the key its job's key derives for it (replica_group_key): whoever holds
// the job's token holds its groups' keys too, and still no other job's.
std::string job_key(std::string_view cluster_secret, std::string_view run_id);
// "<job>.rg<group>" (group: decimal digits) -> {job, group}; nullopt for any other run id.
std::optional<std::pair<std::string_view, std::string_view>> replica_group_of(std::string_view run_id);
// HMAC-SHA256(the job's key, "ddprun-replica-group-v1 " + group).
std::string replica_group_key(std::string_view job_key, std::string_view group);
// The key of `run_id` from the key of job `job` (run_id itself, or one of its replica groups, at
// any depth); nullopt when run_id is neither.
std::optional<std::string> key_within(std::string_view job, std::string_view key, std::string_view run_id);
// The key a store expects for `scope`.
std::string scope_key(std::string_view cluster_secret, std::string_view scope);
std::string random_nonce();
std::string client_mac(std::string_view key, std::string_view scope, std::string_view client_nonce,
                       std::string_view server_nonce);
std::string server_mac(std::string_view key, std::string_view scope, std::string_view client_nonce,
                       std::string_view server_nonce);
// Constant-time comparison.
bool same_mac(std::string_view a, std::string_view b);

// What a protected store checks proofs against: the cluster secret (any scope), or, for a store
// hosted by an agent that holds only its job's token, that one job's key.
struct StoreSecret {
  std::optional<std::string> cluster;
  std::string job_id;
  std::string job_key;
  // The key for `scope`; nullopt for a scope this store cannot serve. Derived keys are cached (a
  // job's agents all prove the same one), so this is not thread-safe: the store's one thread.
  std::optional<std::string> key_for(std::string_view scope) const;

 private:
  mutable std::unordered_map<std::string, std::string> derived_;
};

// A token file's contents: a cluster secret (any bytes, at least 16), or a job token written by
// `ddprun-rendezvous token` ("ddprun-job-token v1 <run id> <hex key>").
struct Token {
  std::string cluster_secret;         // set for a cluster secret
  std::optional<std::string> run_id;  // set for a job token
  std::string job_key;                // set for a job token
};

// Reads a token file, refusing one that others may read (as ssh does) or that is not owned by
// this user (or root). Throws ConfigError naming the file and saying how to fix it.
Token read_token_file(const std::string& path);
// A secret file's contents without trailing newlines, with the same checks; `what` names it in
// errors ("token file", "etcd password file").
std::string read_private_file(const std::string& path, const std::string& what);
// The job token line for `run_id`.
std::string format_job_token(std::string_view cluster_secret, std::string_view run_id);
// What an agent of job `run_id` proves with `token`; throws ConfigError if it is a token for
// another job (a job's token serves its replica groups' run ids too).
Credentials credentials_for(const Token& token, const std::string& run_id, const std::string& token_path);
// What `ddprun-rendezvous status` proves: every job with a cluster secret, one job with its token.
Credentials status_credentials(const Token& token);
// What a store hosted with `token` accepts.
StoreSecret store_secret(const Token& token);

}  // namespace ddprun::rdzv::core
