#pragma once
// The keys of a fault-tolerant replica group (docs/fault-tolerance.md, "The worker contract"): what
// lets its worker store, which any local process may read and write (PyTorch's store clients cannot
// authenticate), and its ranks' state servers be shared with strangers. Byte for byte the same in the
// relay (launcher/ft/relay.cpp), the C++ worker SDK and Python's ddprun_ft. Header-only (the SDK is
// installed without ddprun's libraries); OpenSSL's libcrypto. No I/O, no state.
//
//   K        the round's key: 32 random bytes of the agent that hosts the worker store, given to the
//            workers as DDPRUN_FT_KEY (hex) and to the group's other nodes through the rendezvous
//   sealed   a value under key NAME ("ddprun_ft/ask/3/0", as the workers name it: the store sees a
//            leading "/"): {"body": TEXT, "mac": hex HMAC(K, "ddprun-ft-v1 NAME\n" TEXT)}
//   S_R      rank R's state key: HMAC(K, "ddprun-ft-v1 state R"); the quorum carries it to healing
//            peers as the "#<hex>" end of the rank's address, masked in each worker store it enters:
//            hex(S XOR HMAC(K', "ddprun-ft-v1 mask NAME I")), K' that store's key, NAME the
//            quorum answer's, I the address's place in recover_addresses
//   GET      X-Ddprun-Auth: hex HMAC(S, "ddprun-ft-v1 GET TARGET"); the answer's X-Ddprun-Digest:
//            hex SHA-256 of the body, X-Ddprun-Mac: hex HMAC(S, "ddprun-ft-v1 state STEP LENGTH DIGEST")

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/hex.hpp"

namespace ddprun::ft_wire {

inline constexpr const char* kKeyVariable = "DDPRUN_FT_KEY";
inline constexpr size_t kKeyBytes = 32;
inline constexpr const char* kAuthHeader = "X-Ddprun-Auth";
inline constexpr const char* kDigestHeader = "X-Ddprun-Digest";
inline constexpr const char* kMacHeader = "X-Ddprun-Mac";

// HMAC-SHA256, 32 raw bytes.
inline std::string hmac(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
           data.size(), out, &len) == nullptr)
    throw std::runtime_error("HMAC-SHA256 failed in OpenSSL");
  return std::string(reinterpret_cast<const char*>(out), len);
}

inline std::string sha256_hex(const char* data, size_t n) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, n, out, &len, EVP_sha256(), nullptr) != 1) throw std::runtime_error("SHA-256 failed in OpenSSL");
  return to_hex(std::string_view(reinterpret_cast<const char*>(out), len));
}

// Constant-time equality of two MACs (in hex or raw).
inline bool same(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

inline std::string sealed_mac(std::string_view key, std::string_view name, std::string_view body) {
  std::string data = "ddprun-ft-v1 ";
  data.append(name).push_back('\n');
  data.append(body);
  return to_hex(hmac(key, data));
}

// The value to store under `name`.
inline std::string seal(std::string_view key, std::string_view name, const std::string& body) {
  // Bytes that are not UTF-8 (an error message quoting a peer) are sealed as JSON carries them,
  // U+FFFD in their place, so that every reader MACs what it reads.
  const auto replace = nlohmann::json::error_handler_t::replace;
  const std::string text = nlohmann::json::parse(nlohmann::json(body).dump(-1, ' ', false, replace)).get<std::string>();
  return nlohmann::json{{"body", text}, {"mac", sealed_mac(key, name, text)}}.dump();
}

// The body of a value sealed under `name` with `key`; nullopt for anything else (not sealed, under
// another name or key, changed since).
inline std::optional<std::string> unseal(std::string_view key, std::string_view name, std::string_view value) {
  const nlohmann::json j = nlohmann::json::parse(value, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  const auto body = j.find("body"), mac = j.find("mac");
  if (body == j.end() || mac == j.end() || !body->is_string() || !mac->is_string()) return std::nullopt;
  const std::string& text = body->get_ref<const std::string&>();
  if (!same(mac->get_ref<const std::string&>(), sealed_mac(key, name, text))) return std::nullopt;
  return text;
}

inline std::string state_key(std::string_view key, int rank) {
  return hmac(key, "ddprun-ft-v1 state " + std::to_string(rank));
}

// `secret` (at most 32 bytes) masked, or unmasked, for the `index`-th address of the answer `name`.
inline std::string mask(std::string_view key, std::string_view name, size_t index, std::string secret) {
  if (secret.size() > kKeyBytes) throw std::invalid_argument("ft_wire::mask: a secret of more than 32 bytes");
  const std::string pad = hmac(key, "ddprun-ft-v1 mask " + std::string(name) + " " + std::to_string(index));
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<char>(secret[i] ^ pad[i]);
  return secret;
}

inline std::string request_proof(std::string_view state_key, std::string_view target) {
  return to_hex(hmac(state_key, "ddprun-ft-v1 GET " + std::string(target)));
}

inline std::string answer_mac(std::string_view state_key, int64_t step, uint64_t length, std::string_view digest) {
  return to_hex(hmac(state_key, "ddprun-ft-v1 state " + std::to_string(step) + " " + std::to_string(length) + " " +
                                    std::string(digest)));
}

// The round's key from DDPRUN_FT_KEY's text; nullopt unless it is 64 hex digits.
inline std::optional<std::string> key_of(std::string_view hex) {
  auto key = from_hex(hex);
  if (!key || key->size() != kKeyBytes) return std::nullopt;
  return key;
}

}  // namespace ddprun::ft_wire
