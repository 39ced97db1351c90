#include "launcher/agent/health.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "common/errors.hpp"
#include "rendezvous/server/http_server.hpp"

namespace ddprun::launcher::agent {

HealthEndpoint::HealthEndpoint(uint16_t port) : io_(std::make_unique<boost::asio::io_context>()) {
  auto handler = [this](std::string_view) {
    rdzv::server::HttpReply reply;
    reply.body = answer(reply.status);
    return reply;
  };
  try {
    http_ = std::make_unique<rdzv::server::HttpServer>(*io_, "::", port, "ddprun", handler);
  } catch (const ConnectionError&) {
    http_ = std::make_unique<rdzv::server::HttpServer>(*io_, "0.0.0.0", port, "ddprun", handler);  // no IPv6 here
  }
  port_ = http_->port();
  http_->start();
  thread_ = std::thread([this] {
    auto work = boost::asio::make_work_guard(*io_);
    io_->run();
  });
}

HealthEndpoint::~HealthEndpoint() {
  io_->stop();
  thread_.join();
  http_.reset();
}

void HealthEndpoint::set(Phase phase, std::string detail) {
  std::lock_guard lock(mutex_);
  if (phase_ == Phase::Hung && phase == Phase::Running) return;  // a hang stands until the round ends
  if (phase != phase_) since_ = std::chrono::steady_clock::now();
  phase_ = phase;
  detail_ = std::move(detail);
}

std::string HealthEndpoint::answer(unsigned& status) {
  std::lock_guard lock(mutex_);
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - since_).count();
  const std::string for_text = ", for " + std::to_string(seconds) + " s\n";
  switch (phase_) {
    case Phase::Rendezvous: status = 200; return "ok: rendezvous, " + detail_ + for_text;
    case Phase::Running: status = 200; return "ok: running " + detail_ + for_text;
    case Phase::Restarting: status = 200; return "ok: restarting, " + detail_ + for_text;
    case Phase::Hung: status = 503; return "hung: " + detail_ + for_text;
    case Phase::Ending: status = 503; return "ending: " + detail_ + for_text;
  }
  status = 500;
  return "unknown\n";
}

}  // namespace ddprun::launcher::agent
