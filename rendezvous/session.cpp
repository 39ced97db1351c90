#include "rendezvous/session.hpp"

#include <boost/asio/write.hpp>
#include <cstring>

#include "common/errors.hpp"
#include "common/log.hpp"

namespace ddprun::rdzv {

namespace asio = boost::asio;

Session::Session(asio::ip::tcp::socket socket, KvStore& store, const Limits& limits, OnClose on_close)
    : socket_(std::move(socket)),
      conn_(store, limits, [this] { flush(); }),
      on_close_(std::move(on_close)) {
  boost::system::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  if (!ec) {
    peer_ = ep.address().is_v6() ? "[" + ep.address().to_string() + "]" : ep.address().to_string();
    peer_ += ":" + std::to_string(ep.port());
  } else {
    peer_ = "<unknown peer>";
  }
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
}

void Session::start() {
  DDPRUN_LOG_DEBUG("store") << "client " << peer_ << " connected";
  read();
}

void Session::read() {
  if (closed_ || read_in_flight_) return;
  // Compact, then make room for at least one chunk past the pending partial request.
  if (in_begin_ == in_end_) {
    in_begin_ = in_end_ = 0;
  } else if (in_begin_ > 0 && in_begin_ >= in_.size() / 2) {
    std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
    in_end_ -= in_begin_;
    in_begin_ = 0;
  }
  if (in_.size() - in_end_ < kReadChunk) in_.resize(std::max(in_.size() * 2, in_end_ + kReadChunk));
  read_in_flight_ = true;
  socket_.async_read_some(asio::buffer(in_.data() + in_end_, in_.size() - in_end_),
                          [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
                            self->on_read(ec, n);
                          });
}

void Session::on_read(const boost::system::error_code& ec, size_t n) {
  read_in_flight_ = false;
  if (closed_) return;
  if (ec) {
    const std::string_view partial(in_.data() + in_begin_, in_end_ - in_begin_);
    if (ec == asio::error::eof || ec == asio::error::connection_reset) {
      if (!partial.empty()) {
        close("disconnected mid-request (" + conn_.describe_partial(partial) + ")");
      } else if (conn_.waiting()) {
        close("disconnected while waiting on " + std::to_string(conn_.missing_keys()) + " key(s)");
      } else {
        close("");
      }
    } else {
      close("read failed: " + ec.message());
    }
    return;
  }
  in_end_ += n;
  try {
    const size_t used = conn_.consume(std::string_view(in_.data() + in_begin_, in_end_ - in_begin_));
    in_begin_ += used;
  } catch (const ProtocolError& e) {
    close(std::string("bad request, closing the connection: ") + e.what());
    return;
  }
  flush();
  // Large unread replies: stop reading until they drain (on_written resumes).
  if (!output_backlogged()) read();
}

void Session::flush() {
  if (closed_ || write_in_flight_ || conn_.output().empty()) return;
  writing_.swap(conn_.output());
  write_in_flight_ = true;
  asio::async_write(socket_, asio::buffer(writing_),
                    [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                      self->on_written(ec);
                    });
}

void Session::on_written(const boost::system::error_code& ec) {
  write_in_flight_ = false;
  if (closed_) return;
  if (ec) {
    close("write failed: " + ec.message());
    return;
  }
  writing_.clear();
  if (writing_.capacity() > kReadChunk * 4) std::string().swap(writing_);
  flush();
  if (!output_backlogged()) read();
}

void Session::close(std::string_view reason) {
  if (closed_) return;
  closed_ = true;
  if (!reason.empty()) {
    log::warn("store") << "client " << peer_ << ": " << reason;
  } else {
    DDPRUN_LOG_DEBUG("store") << "client " << peer_ << " disconnected after " << conn_.requests() << " requests";
  }
  boost::system::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  // Clears this client's waits and watches now, not when the last handler lets go of the session.
  conn_.release();
  if (on_close_) on_close_(this);
}

}  // namespace ddprun::rdzv
