#include "rendezvous/core/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/errors.hpp"
#include "common/hex.hpp"

namespace ddprun::rdzv::core {
namespace {

constexpr std::string_view kJobTokenHeader = "ddprun-job-token v1 ";
constexpr size_t kMinSecretBytes = 16;

std::string mac(std::string_view key, std::string_view role, std::string_view scope, std::string_view client_nonce,
                std::string_view server_nonce) {
  std::string data = "ddprun-auth-v1 ";
  data.append(role).push_back('\0');
  data.append(scope).push_back('\0');
  data.append(client_nonce);
  data.append(server_nonce);
  return hmac_sha256(key, data);
}

}  // namespace

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
            data.size(), out, &len)) {
    throw std::runtime_error("HMAC-SHA256 failed in OpenSSL");
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::optional<std::pair<std::string_view, std::string_view>> replica_group_of(std::string_view run_id) {
  const auto dot = run_id.rfind(".rg");
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  const std::string_view group = run_id.substr(dot + 3);
  if (group.empty() || group.size() > 9 ||
      !std::all_of(group.begin(), group.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::make_pair(run_id.substr(0, dot), group);
}

std::string replica_group_key(std::string_view job_key, std::string_view group) {
  return hmac_sha256(job_key, std::string("ddprun-replica-group-v1 ") + std::string(group));
}

std::string job_key(std::string_view cluster_secret, std::string_view run_id) {
  if (const auto g = replica_group_of(run_id)) return replica_group_key(job_key(cluster_secret, g->first), g->second);
  return hmac_sha256(cluster_secret, std::string("ddprun-job-v1 ") + std::string(run_id));
}

std::optional<std::string> key_within(std::string_view job, std::string_view key, std::string_view run_id) {
  if (run_id == job) return std::string(key);
  const auto g = replica_group_of(run_id);
  if (!g) return std::nullopt;
  const auto parent = key_within(job, key, g->first);
  if (!parent) return std::nullopt;
  return replica_group_key(*parent, g->second);
}

std::string scope_key(std::string_view cluster_secret, std::string_view scope) {
  return scope == kAllJobs ? std::string(cluster_secret) : job_key(cluster_secret, scope);
}

std::string random_nonce() {
  std::string n(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    throw std::runtime_error("OpenSSL could not produce random bytes for a nonce");
  }
  return n;
}

std::string client_mac(std::string_view key, std::string_view scope, std::string_view client_nonce,
                       std::string_view server_nonce) {
  return mac(key, "client", scope, client_nonce, server_nonce);
}

std::string server_mac(std::string_view key, std::string_view scope, std::string_view client_nonce,
                       std::string_view server_nonce) {
  return mac(key, "server", scope, client_nonce, server_nonce);
}

bool same_mac(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string read_private_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw ConfigError("cannot read the " + what + " " + path + ": " + std::strerror(errno));
  }
  if ((st.st_mode & 077) != 0) {
    throw ConfigError("the " + what + " " + path + " may be read by others (mode " +
                      std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7) +
                      std::to_string(st.st_mode & 7) + "); a secret must be yours alone: chmod 600 " + path);
  }
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    throw ConfigError("the " + what + " " + path + " belongs to another user (uid " + std::to_string(st.st_uid) +
                      "); a secret must be yours alone");
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  if (!in && !in.eof()) throw ConfigError("cannot read the " + what + " " + path);
  std::string text = buf.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  return text;
}

Token read_token_file(const std::string& path) {
  std::string text = read_private_file(path, "token file");
  Token t;
  if (text.rfind(kJobTokenHeader, 0) == 0) {
    std::istringstream fields(text.substr(kJobTokenHeader.size()));
    std::string run_id, hex;
    fields >> run_id >> hex;
    auto key = from_hex(hex);
    if (run_id.empty() || !key || key->size() != kMacBytes) {
      throw ConfigError("the token file " + path + " starts like a job token but is not one (expected '" +
                        std::string(kJobTokenHeader) +
                        "<run id> <64 hex digits>', as `ddprun-rendezvous token` writes)");
    }
    t.run_id = run_id;
    t.job_key = *key;
    return t;
  }
  if (text.size() < kMinSecretBytes) {
    throw ConfigError("the token file " + path + " holds " + std::to_string(text.size()) +
                      " bytes; a secret needs at least " + std::to_string(kMinSecretBytes) +
                      " (e.g. head -c 32 /dev/urandom | base64 > " + path + "; chmod 600 " + path + ")");
  }
  t.cluster_secret = std::move(text);
  return t;
}

std::string format_job_token(std::string_view cluster_secret, std::string_view run_id) {
  return std::string(kJobTokenHeader) + std::string(run_id) + " " + to_hex(job_key(cluster_secret, run_id)) + "\n";
}

Credentials credentials_for(const Token& token, const std::string& run_id, const std::string& token_path) {
  if (!token.run_id) return Credentials{run_id, job_key(token.cluster_secret, run_id)};
  auto key = key_within(*token.run_id, token.job_key, run_id);
  if (!key) {
    throw ConfigError("the token in " + token_path + " is for job '" + *token.run_id + "', not '" + run_id +
                      "': give this job its own token (ddprun-rendezvous token --rdzv_id " + run_id + ")");
  }
  return Credentials{run_id, std::move(*key)};
}

std::optional<std::string> StoreSecret::key_for(std::string_view scope) const {
  if (cluster) {
    if (scope == kAllJobs) return *cluster;
    auto it = derived_.find(std::string(scope));
    if (it != derived_.end()) return it->second;
    if (derived_.size() >= 4096) derived_.clear();  // bounded: job ids come from clients
    return derived_.emplace(std::string(scope), rdzv::core::job_key(*cluster, scope)).first->second;
  }
  if (!job_id.empty()) return key_within(job_id, job_key, scope);
  return std::nullopt;
}

StoreSecret store_secret(const Token& token) {
  StoreSecret s;
  if (token.run_id) {
    s.job_id = *token.run_id;
    s.job_key = token.job_key;
  } else {
    s.cluster = token.cluster_secret;
  }
  return s;
}

Credentials status_credentials(const Token& token) {
  if (token.run_id) return Credentials{*token.run_id, token.job_key};
  return Credentials{std::string(kAllJobs), token.cluster_secret};
}

}  // namespace ddprun::rdzv::core
