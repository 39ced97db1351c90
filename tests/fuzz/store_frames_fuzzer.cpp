// libFuzzer target: arbitrary bytes as one client connection's stream, split at fuzzer-chosen
// points, through dialect detection, the frame decoder and the key-value state machine. A second
// connection waits on keys, so wake-ups and cancellation are exercised too. Bad input must end in
// ProtocolError, never a crash, a hang or unbounded growth.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/errors.hpp"
#include "rendezvous/store_connection.hpp"

using namespace ddprun::rdzv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Limits limits;
  limits.max_key_bytes = 256;
  limits.max_value_bytes = 4096;
  limits.max_keys_per_request = 64;
  limits.max_request_bytes = 64 * 1024;
  KvStore store;
  StoreConnection watcher(store, limits, nullptr);
  StoreConnection conn(store, limits, nullptr);
  // The watcher waits on a few keys the input is likely to create.
  std::string wait_req = std::string("\x05\x02\0\0\0\0\0\0\0", 9);
  for (std::string_view k : {std::string_view("a"), std::string_view("/k")}) {
    wait_req.push_back(static_cast<char>(k.size()));
    wait_req.append(7, '\0');
    wait_req.append(k);
  }
  watcher.consume(wait_req);

  // The first byte picks a chunk size, so the same request is seen split at many points.
  const size_t chunk = 1 + data[0] % 17;
  std::string buffer;
  try {
    for (size_t off = 1; off < size; off += chunk) {
      buffer.append(reinterpret_cast<const char*>(data) + off, std::min(chunk, size - off));
      buffer.erase(0, conn.consume(buffer));
      if (buffer.size() > limits.max_request_bytes) __builtin_trap();  // the decoder must have refused
      conn.output().clear();
    }
  } catch (const ddprun::ProtocolError&) {
  }
  return 0;
}
