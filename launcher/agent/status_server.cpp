#include "launcher/agent/status_server.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "common/job_pages.hpp"
#include "launcher/view/job_page.hpp"
#include "rendezvous/server/http_server.hpp"

namespace ddprun::launcher::agent {

StatusServer::StatusServer(uint16_t port, view::ViewSettings view, const std::vector<std::string>& allowed_hosts)
    : view_(view), hosts_(allowed_hosts, "--http_allowed_hosts"), io_(std::make_unique<boost::asio::io_context>()) {
  auto handler = [this](const rdzv::server::HttpRequest& request) {
    if (auto page = view::serve_view(view_, request, hosts_)) return std::move(*page);
    rdzv::server::HttpReply reply;
    reply.body = answer(request.target, reply.status, reply.content_type);
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
    // Below the agent's own threads: a flood of requests takes CPU from this thread first, never
    // from the supervision of the workers (benchmarks/job_page_bench.sh measures it).
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
    auto work = boost::asio::make_work_guard(*io_);
    io_->run();
  });
}

StatusServer::~StatusServer() {
  io_->stop();
  thread_.join();
  http_.reset();
  if (!advertised_.empty()) ::unlink(advertised_.c_str());
}

void StatusServer::advertise(const std::string& run_id, const std::string& program) {
  advertised_ = job_pages::publish(port_, run_id, program);
}

const char* StatusServer::name(Phase phase) {
  switch (phase) {
    case Phase::Connecting: return "connecting";
    case Phase::Rendezvous: return "rendezvous";
    case Phase::Joined: return "joined";
    case Phase::Spare: return "spare";
    case Phase::Running: return "running";
    case Phase::Stopping: return "stopping";
    case Phase::Finishing: return "finishing";
    case Phase::Restarting: return "restarting";
    case Phase::Hung: return "hung";
    case Phase::Ending: return "ending";
  }
  return "unknown";
}

void StatusServer::set(Phase phase, std::string detail, int round) {
  std::lock_guard lock(mutex_);
  // A hang stands until the round ends.
  if (phase_ == Phase::Hung && (phase == Phase::Running || phase == Phase::Stopping || phase == Phase::Finishing)) {
    return;
  }
  if (phase != phase_) since_ = std::chrono::steady_clock::now();
  phase_ = phase;
  detail_ = std::move(detail);
  if (round >= 0) round_ = round;
  view_.set_phase(name(phase_), detail_, phase_ != Phase::Hung && phase_ != Phase::Ending, round_);
}

std::string StatusServer::answer(std::string_view target, unsigned& status, std::string& content_type) {
  std::lock_guard lock(mutex_);
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - since_).count();
  const bool ok = phase_ != Phase::Hung && phase_ != Phase::Ending;
  status = ok ? 200 : 503;
  const auto query = target.find('?');
  if (query != std::string_view::npos && target.find("format=json", query) != std::string_view::npos) {
    content_type = "application/json";
    return nlohmann::json{
               {"ok", ok}, {"phase", name(phase_)}, {"round", round_}, {"seconds", seconds}, {"detail", detail_}}
               .dump() +
           "\n";
  }
  return std::string(ok ? "ok: " : "") + name(phase_) + (ok ? ", " : ": ") + detail_ + ", for " +
         std::to_string(seconds) + " s\n";
}

}  // namespace ddprun::launcher::agent
