#pragma once
// ddprun's signal handling: one thread of its own waits for the handled signals (and SIGINT) with
// an Asio signal_set, so a signal is acted on in every state of the agent, not only while workers
// run: the callback runs on that thread, and the agent turns it into a stop request (which wakes
// any rendezvous wait) and a delivery to the supervisor's loop.
//
// Lifetime: handlers are installed in the constructor and removed in the destructor, which joins
// the thread. Create it before the agent starts waiting on anything.

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <functional>
#include <thread>
#include <vector>

namespace ddprun::launcher::workers {

class SignalWatcher {
 public:
  // `on_signal` runs on the watcher's thread for every signal received.
  SignalWatcher(const std::vector<int>& signals, std::function<void(int)> on_signal);
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  void arm();

  boost::asio::io_context io_{1};
  boost::asio::signal_set set_{io_};
  std::function<void(int)> on_signal_;
  std::thread thread_;
};

// SIGINT, SIGTERM, SIGHUP and SIGQUIT stop the job; other handled signals are only forwarded.
bool is_stop_signal(int signo);

}  // namespace ddprun::launcher::workers
