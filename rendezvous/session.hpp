#pragma once
// One accepted TCP connection of the store server: reads bytes, hands them to a StoreConnection,
// writes the replies back. Runs entirely on the server's io_context thread.
//
// Memory per connection is bounded: the input buffer never holds more than one request
// (Limits::max_request_bytes), and reading pauses while more than kHighWater reply bytes wait to
// be sent to a client that does not read them.

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/store_connection.hpp"

namespace ddprun::rdzv {

class Session : public std::enable_shared_from_this<Session> {
 public:
  using OnClose = std::function<void(Session*)>;

  Session(boost::asio::ip::tcp::socket socket, KvStore& store, const Limits& limits, OnClose on_close);
  void start();
  // Closes the socket at once; used by Server::stop().
  void close(std::string_view reason);
  const std::string& peer() const { return peer_; }

 private:
  static constexpr size_t kReadChunk = 64 * 1024;
  static constexpr size_t kHighWater = 16 * 1024 * 1024;

  void read();
  void on_read(const boost::system::error_code& ec, size_t n);
  void flush();
  void on_written(const boost::system::error_code& ec);
  bool output_backlogged() const { return writing_.size() + conn_.output().size() > kHighWater; }

  boost::asio::ip::tcp::socket socket_;
  StoreConnection conn_;
  OnClose on_close_;
  std::string peer_;
  std::vector<char> in_;
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
  std::string writing_;
  bool write_in_flight_ = false;
  bool read_in_flight_ = false;
  bool closed_ = false;
};

}  // namespace ddprun::rdzv
