#pragma once
// One accepted TCP connection of the store server: its socket, the bytes received and not yet
// applied, and its StoreConnection. Owned and driven by Server on its one I/O thread (see Server
// for why it reads and writes the socket itself rather than through Asio's per-socket operations).
//
// Memory is what the connection holds right now: an idle connection has no input buffer and no
// output queue; the input grows with a partial request and is released once drained.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <string>
#include <vector>

#include "common/unique_fd.hpp"
#include "rendezvous/core/store_connection.hpp"

namespace ddprun::rdzv::server {

class Session {
 public:
  // `on_async_output` runs when a wake-up or watch event queued bytes for this client.
  // `secret` (not owned): the store is protected (see StoreConnection).
  Session(UniqueFd fd, std::string peer, core::KvStore& store, const core::Limits& limits,
          std::function<void(Session&)> on_async_output, const core::StoreSecret* secret = nullptr);
  ~Session();  // closes the socket
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  enum class ReadStatus {
    Drained,  // the socket has nothing more now
    Budget,   // `budget` bytes read; there may be more
    Closed,   // the peer closed (or reset) the connection; what came before it is in input()
  };
  // Appends what the socket holds to input(), up to `budget` bytes, reading through `scratch`.
  ReadStatus read(std::span<char> scratch, size_t budget, size_t& received);
  // Sends what is owed until the socket's buffer is full. Returns false on a write error (the
  // peer is gone), with errno's value in `error`.
  bool flush(size_t& sent, int& error);
  // Releases the input buffer's memory when it is empty and large.
  void trim_input();
  // Drops the first `used` bytes of the input (applied).
  void consume_input(size_t used);
  // When the oldest byte still in the input arrived ({}: none). A request read but not applied
  // (its client does not read its replies) keeps the time its bytes came, whatever came since.
  std::chrono::steady_clock::time_point held_since() const {
    return arrivals_.empty() ? std::chrono::steady_clock::time_point{} : arrivals_.front().at;
  }

  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }
  core::StoreConnection& conn() { return conn_; }
  std::string& input() { return input_; }

  // The server's bookkeeping for this connection.
  struct Flags {
    bool in_batch = false;  // has bytes to apply in the current batch
    bool dirty = false;     // has bytes to send
    bool paused = false;    // a request waits for the client to read (no reading meanwhile)
    bool peer_closed = false;
    bool closing = false;     // closed; destroyed at the end of the batch
    uint32_t registered = 0;  // epoll events registered
  } flags;
  // A protected store's connection that has not proved the secret yet: when it connected, and
  // where it sits in the server's list of them (oldest first).
  struct PendingHandshake {
    bool pending = false;
    std::chrono::steady_clock::time_point since;
    std::list<Session*>::iterator at;
  } handshake;
  // When the incomplete request at the front of the input began to arrive ({}: none); the server
  // closes the connection past ServerOptions::request_timeout.
  std::chrono::steady_clock::time_point partial_since;
  // The memory the input holds (its capacity) as counted in the server's total: an unfinished
  // request, or requests read that wait for the client to read its replies.
  size_t unfinished_counted = 0;
  // The replies' bytes copied for this client (core::OutputQueue::owned) as counted in the
  // server's total, and since when it has been owed them without taking any ({}: owes nothing).
  size_t owed_counted = 0;
  std::chrono::steady_clock::time_point owed_since;

  // Closes the socket now (the object may live on until the end of the batch); idempotent.
  void close_socket();

 private:
  void note_arrival(size_t received);  // the bytes just appended to the input arrived now
  UniqueFd fd_;
  std::string peer_;
  core::StoreConnection conn_;
  std::string input_;
  // When the input's bytes arrived: up to byte `end` (counted from the connection's first) at
  // `at`, oldest first; at most kMaxArrivals (the newest merged into the one before: older).
  struct Arrival {
    uint64_t end;
    std::chrono::steady_clock::time_point at;
  };
  static constexpr size_t kMaxArrivals = 32;
  std::vector<Arrival> arrivals_;  // a vector: an idle connection holds no memory for it
  uint64_t read_total_ = 0, used_total_ = 0;
};

// "127.0.0.1:41234" or "[::1]:41234" for a socket address.
std::string format_sockaddr(const void* addr);

}  // namespace ddprun::rdzv::server
