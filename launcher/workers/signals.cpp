#include "launcher/workers/signals.hpp"

#include <csignal>

#include "common/log.hpp"

namespace ddprun::launcher::workers {

bool is_stop_signal(int signo) { return signo == SIGINT || signo == SIGTERM || signo == SIGHUP || signo == SIGQUIT; }

SignalWatcher::SignalWatcher(const std::vector<int>& signals, std::function<void(int)> on_signal)
    : on_signal_(std::move(on_signal)) {
  for (int s : signals) set_.add(s);
  // A terminal's Ctrl-C goes to the foreground group: SIGINT is always ours to handle.
  boost::system::error_code ignored;
  set_.add(SIGINT, ignored);
  arm();
  thread_ = std::thread([this] {
    try {
      io_.run();
    } catch (const std::exception& e) {
      log::error("ddprun") << "signal handling stopped: " << e.what();
    }
  });
}

SignalWatcher::~SignalWatcher() {
  io_.stop();
  if (thread_.joinable()) thread_.join();
  boost::system::error_code ignored;
  set_.clear(ignored);
}

void SignalWatcher::arm() {
  set_.async_wait([this](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    on_signal_(signo);
    arm();
  });
}

}  // namespace ddprun::launcher::workers
