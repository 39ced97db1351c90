// The etcd client's shared pieces (etcd_wire.hpp) and the free functions of etcd_client.hpp.
#include "launcher/rendezvous/etcd/etcd_wire.hpp"

#include "common/numbers.hpp"

namespace ddprun::launcher::rendezvous::etcd {

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string base64_encode(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string base64_decode(const std::string& text) {
  if (text.empty()) return "";
  if (text.size() % 4 != 0) throw ProtocolError("etcd sent a base64 value whose length is not a multiple of 4");
  std::string out(3 * text.size() / 4, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) throw ProtocolError("etcd sent a value that is not base64");
  size_t len = static_cast<size_t>(n);
  // EVP_DecodeBlock counts the padding as zero bytes.
  for (auto it = text.rbegin(); it != text.rend() && *it == '='; ++it) --len;
  out.resize(len);
  return out;
}

int64_t int64_of(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    if (const auto v = to_int(it->get<std::string>())) return *v;
    throw ProtocolError(std::string("etcd sent a non-numeric ") + name + ": " +
                        printable_start(it->get<std::string>()));
  }
  return 0;
}

KeyValue kv_of(const json& j) {
  KeyValue kv;
  kv.key = base64_decode(string_field(j, "key"));
  kv.value = base64_decode(string_field(j, "value"));
  kv.create_revision = int64_of(j, "create_revision");
  kv.mod_revision = int64_of(j, "mod_revision");
  kv.version = int64_of(j, "version");
  kv.lease = int64_of(j, "lease");
  return kv;
}

RangeResult range_of(const json& j) {
  RangeResult r;
  if (auto h = j.find("header"); h != j.end()) r.revision = int64_of(*h, "revision");
  if (auto kvs = j.find("kvs"); kvs != j.end() && kvs->is_array()) {
    for (const json& kv : *kvs) r.kvs.push_back(kv_of(kv));
  }
  r.count = int64_of(j, "count");
  return r;
}

json op_json(const Op& op) {
  switch (op.kind) {
    case Op::Kind::Put: {
      json p = {{"key", base64_encode(op.key)}, {"value", base64_encode(op.value)}};
      if (op.lease) p["lease"] = std::to_string(op.lease);
      return {{"request_put", p}};
    }
    case Op::Kind::Range: {
      json r = {{"key", base64_encode(op.key)}};
      if (!op.range_end.empty()) r["range_end"] = base64_encode(op.range_end);
      return {{"request_range", r}};
    }
    case Op::Kind::Delete: {
      json d = {{"key", base64_encode(op.key)}};
      if (!op.range_end.empty()) d["range_end"] = base64_encode(op.range_end);
      return {{"request_delete_range", d}};
    }
  }
  return json::object();
}

// An error answer: {"error": ..., "message": ..., "code": N}.
std::pair<int, std::string> error_of(const std::string& text, int http_status) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_object() && j.contains("code")) {
    return {static_cast<int>(int64_of(j, "code")),
            string_field(j, "message", string_field(j, "error", "(no message)"))};
  }
  return {http_status == 503 ? kUnavailable : -1, "HTTP " + std::to_string(http_status) + ": " + printable_start(text)};
}

bool transient(int code, const std::string& message) {
  return code == kUnavailable || message.find("leader changed") != std::string::npos ||
         message.find("no leader") != std::string::npos || message.find("timed out") != std::string::npos ||
         message.find("not capable") != std::string::npos || message.find("too many requests") != std::string::npos;
}

TlsContext::TlsContext(const Options& o) {
  boost::system::error_code ec;
  if (!o.ca_file.empty()) {
    ctx.load_verify_file(o.ca_file, ec);
    if (ec) throw ConfigError("etcd ca_file '" + o.ca_file + "': " + ec.message());
  } else {
    ctx.set_default_verify_paths(ec);
  }
  if (!o.cert_file.empty()) {
    ctx.use_certificate_chain_file(o.cert_file, ec);
    if (ec) throw ConfigError("etcd cert_file '" + o.cert_file + "': " + ec.message());
    ctx.use_private_key_file(o.key_file.empty() ? o.cert_file : o.key_file, asio::ssl::context::pem, ec);
    if (ec) throw ConfigError("etcd key_file '" + o.key_file + "': " + ec.message());
  }
  ctx.set_verify_mode(asio::ssl::verify_peer);
}

}  // namespace ddprun::launcher::rendezvous::etcd
