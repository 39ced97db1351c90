// libFuzzer target: arbitrary bytes as one client connection's stream, through dialect detection,
// the resumable frame decoder and the key-value state machine, twice: once in one piece and once
// split at fuzzer-chosen points. Both runs must give the same replies, the same error (if any) and
// the same store afterwards: the decoder that resumes where it stopped may not decode anything
// differently from one that sees the whole request. A second connection waits on keys, so wake-ups
// and cancellation are exercised too. Bad input must end in ProtocolError, never a crash, a hang or
// unbounded growth.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/errors.hpp"
#include "rendezvous/core/store_connection.hpp"

using namespace ddprun::rdzv::core;

namespace {

Limits fuzz_limits() {
  Limits limits;
  limits.max_key_bytes = 256;
  limits.max_value_bytes = 4096;
  limits.max_keys_per_request = 64;
  limits.max_request_bytes = 64 * 1024;
  limits.output_high_water = uint64_t{1} << 40;  // never defer: replies are taken after every slice
  return limits;
}

struct Run {
  Limits limits = fuzz_limits();
  KvStore store{StoreLimits{256, 64 * 1024}};
  StoreConnection watcher{store, limits, nullptr};
  StoreConnection conn{store, limits, nullptr};
  std::string replies;
  std::string wakeups;
  std::string error;

  Run() {
    // The watcher waits on a few keys the input is likely to create.
    std::string wait_req = std::string("\x05\x02\0\0\0\0\0\0\0", 9);
    for (std::string_view k : {std::string_view("a"), std::string_view("/k")}) {
      wait_req.push_back(static_cast<char>(k.size()));
      wait_req.append(7, '\0');
      wait_req.append(k);
    }
    watcher.consume(wait_req);
  }

  void feed(const uint8_t* data, size_t size, size_t chunk) {
    std::string buffer;
    try {
      for (size_t off = 0; off < size; off += chunk) {
        buffer.append(reinterpret_cast<const char*>(data) + off, std::min(chunk, size - off));
        buffer.erase(0, conn.consume(buffer));
        if (buffer.size() > limits.max_request_bytes) __builtin_trap();  // the decoder must have refused
        replies += conn.output().take_all();
        wakeups += watcher.output().take_all();
      }
    } catch (const ddprun::ProtocolError& e) {
      error = e.what();
      replies += conn.output().take_all();
      wakeups += watcher.output().take_all();
    }
  }

  std::string state() const {
    std::string s = std::to_string(store.num_keys()) + "|" + std::to_string(store.stored_bytes()) + "|" +
                    std::to_string(store.waiting_clients());
    for (const std::string& k : store.list()) s += "|" + k + "=" + *store.get(k);
    return s;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks a chunk size, so the same request is seen split at many points.
  const size_t chunk = 1 + data[0] % 17;
  Run whole, sliced;
  whole.feed(data + 1, size - 1, size);
  sliced.feed(data + 1, size - 1, chunk);
  if (whole.replies != sliced.replies || whole.wakeups != sliced.wakeups || whole.error != sliced.error ||
      whole.state() != sliced.state()) {
    __builtin_trap();  // resumed decoding differs from decoding in one piece
  }
  return 0;
}
