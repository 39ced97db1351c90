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
  // A protected store's connection that has not proved the secret yet: when it connected, whether
  // it has sent a byte since (an honest client sends its hello at once), and where it sits in the
  // server's list of them (oldest first).
  struct PendingHandshake {
    bool pending = false;
    bool heard = false;
    std::chrono::steady_clock::time_point since;
    std::list<Session*>::iterator at;
  } handshake;

  // Closes the socket now (the object may live on until the end of the batch); idempotent.
  void close_socket();

 private:
  UniqueFd fd_;
  std::string peer_;
  core::StoreConnection conn_;
  std::string input_;
};

// "127.0.0.1:41234" or "[::1]:41234" for a socket address.
std::string format_sockaddr(const void* addr);

}  // namespace ddprun::rdzv::server
