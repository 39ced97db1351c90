#pragma once
// Moving one rank's state to a healing peer of another replica group (fault_tolerance.hpp), the
// wire shared with Python's ddprun_ft (common/ft_wire.hpp draws it): HTTP/1.1 GET /state/<step>
// that proves the rank's state key (X-Ddprun-Auth), answered with the bytes of a torch.save file
// and, in the header, their SHA-256 and a MAC of the step, length and digest. The key comes from
// the round's key; the quorum carries it to the healing peer, masked in every store it crosses. A
// request without the proof gets a 403 that names no step; a peer loads nothing this rank did not
// send, and reads no more than the length the MAC vouches for. No Torch here: bytes in, bytes out
// (Boost.Beast for HTTP, OpenSSL's libcrypto for the MACs).
//
// The server: one thread (Asio), every connection at once, at most kMaxConnections (a new one
// closes the oldest still sending its request), each with 10 s to send it and 30 s for each part
// of the answer the peer takes in. The fetch: one deadline for the whole of it.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddprun::worker::ft::detail {

class Connection;

// Serves the state of one step at a time. Thread-safety: offer() from any thread; the server runs
// on a thread of its own from construction to destruction.
class StateServer {
 public:
  static constexpr size_t kMaxConnections = 32;
  // Listens on `host`, a port the kernel picks; answers requests that prove `key` (this rank's
  // state key). Throws std::runtime_error when it cannot listen.
  StateServer(const std::string& host, std::string key);
  ~StateServer();
  StateServer(const StateServer&) = delete;
  StateServer& operator=(const StateServer&) = delete;

  // "host:port": where healing peers ask (the ask's "recovery").
  const std::string& address() const { return address_; }
  // From now on, GET /state/<step> answers `bytes`; any other step is a 404.
  void offer(int64_t step, std::vector<char> bytes);

 private:
  friend class Connection;  // one peer's request, on the server's thread (state_transfer.cpp)
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

// Fetches step `step` from a peer at `address` ("host:port") with its state `key`, retrying while
// the peer has not offered it yet (404: it has not read the same quorum) or cannot be reached,
// until `timeout`. Throws std::runtime_error on a refusal, a timeout, or an answer the key does
// not vouch for.
std::vector<char> fetch_state(const std::string& address, const std::string& key, int64_t step,
                              std::chrono::milliseconds timeout);

}  // namespace ddprun::worker::ft::detail
