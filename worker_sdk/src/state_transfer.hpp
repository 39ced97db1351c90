#pragma once
// Moving one rank's state to a healing peer of another replica group (fault_tolerance.hpp), the
// wire shared with Python's ddprun_ft: HTTP/1.1 GET /state/<step>, the body the bytes of a
// torch.save file, the header X-Ddprun-Mac: HMAC-SHA256(key, body) in hex. The key is the
// server's, random per process, and travels only inside the quorum (the rendezvous store, then the
// peers' worker stores) as the "#<hex>" end of the server's address; a peer loads nothing this
// rank did not send. No Torch here: bytes in, bytes out (Boost.Beast for HTTP, OpenSSL's
// libcrypto for the MAC).

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddprun::worker::ft::detail {

// Serves the state of one step at a time. Thread-safety: offer() from any thread; the server runs
// on a thread of its own from construction to destruction.
class StateServer {
 public:
  // Listens on `host`, a port the kernel picks. Throws std::runtime_error when it cannot.
  explicit StateServer(const std::string& host);
  ~StateServer();
  StateServer(const StateServer&) = delete;
  StateServer& operator=(const StateServer&) = delete;

  // "host:port#key-in-hex": what the quorum carries to healing peers.
  const std::string& address() const { return address_; }
  // From now on, GET /state/<step> answers `bytes`; any other step is a 404.
  void offer(int64_t step, std::vector<char> bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

// Fetches step `step` from a peer's `address` ("host:port#key"), retrying while the peer has not
// offered it yet (404: it has not read the same quorum) until `timeout`. Throws std::runtime_error
// on a refusal, a timeout, or a body whose MAC is not the peer's key's.
std::vector<char> fetch_state(const std::string& address, int64_t step, std::chrono::milliseconds timeout);

}  // namespace ddprun::worker::ft::detail
