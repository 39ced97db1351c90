#include "launcher/watchdog/file_timer.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/system.hpp"

namespace ddprun::launcher::watchdog {

namespace {

constexpr size_t kMaxLine = size_t{64} << 10;

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

FileTimerServer::FileTimerServer(std::string path, std::function<int(pid_t)> owner,
                                 std::function<void(const TimerExpiry&, int)> on_expired)
    : path_(std::move(path)), owner_(std::move(owner)), on_expired_(std::move(on_expired)) {
  ::unlink(path_.c_str());  // as FileTimerServer does: a stale FIFO (or file) of an earlier run
  if (::mkfifo(path_.c_str(), 0600) != 0) {
    throw ProcessError("cannot create the torchelastic timer FIFO " + path_ + ": " + std::strerror(errno));
  }
  read_fd_.reset(::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (read_fd_) keep_open_fd_.reset(::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  int wake[2] = {-1, -1};
  if (!read_fd_ || !keep_open_fd_ || ::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int e = errno;
    ::unlink(path_.c_str());
    throw ProcessError("cannot open the torchelastic timer FIFO " + path_ + ": " + std::strerror(e));
  }
  wake_read_.reset(wake[0]);
  wake_write_.reset(wake[1]);
  thread_ = std::thread([this] { serve(); });
}

FileTimerServer::~FileTimerServer() {
  [[maybe_unused]] auto n = ::write(wake_write_.get(), "x", 1);
  if (thread_.joinable()) thread_.join();
  ::unlink(path_.c_str());
}

std::string FileTimerServer::handle_line(const std::string& line) {
  ++requests_;
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "not a JSON object";
  auto num = [&](const char* k) -> const nlohmann::json* {
    auto it = j.find(k);
    return it != j.end() && it->is_number() ? &*it : nullptr;
  };
  const auto* pid = num("pid");
  const auto* when = num("expiration_time");
  auto scope = j.find("scope_id");
  if (!pid || !when || scope == j.end() || !scope->is_string()) {
    return "needs pid (a number), scope_id (a string) and expiration_time (a number)";
  }
  TimerExpiry t;
  t.pid = static_cast<pid_t>(pid->get<int64_t>());
  t.scope = scope->get<std::string>();
  t.expiration_time = when->get<double>();
  if (const auto* sig = num("signal")) t.signal = static_cast<int>(sig->get<int64_t>());
  if (t.pid <= 0 || !std::isfinite(t.expiration_time) || t.signal >= 65)
    return "pid, expiration_time or signal out of range";
  std::lock_guard lock(mutex_);
  const auto key = std::make_pair(t.pid, t.scope);
  if (t.expiration_time < 0) {
    timers_.erase(key);  // a release
  } else {
    timers_[key] = std::move(t);
  }
  return "";
}

void FileTimerServer::expire(double now) {
  // Expired timers, grouped by pid: the earliest one with a signal decides, as in FileTimerServer.
  std::map<pid_t, std::vector<TimerExpiry>> due;
  {
    std::lock_guard lock(mutex_);
    for (auto it = timers_.begin(); it != timers_.end();) {
      if (it->second.expiration_time <= now) {
        due[it->first.first].push_back(it->second);
        it = timers_.erase(it);
      } else {
        ++it;
      }
    }
    // The pid's other timers go too: the worker is being reaped.
    for (auto it = timers_.begin(); it != timers_.end();) {
      it = due.count(it->first.first) ? timers_.erase(it) : std::next(it);
    }
  }
  for (auto& [pid, list] : due) {
    std::sort(list.begin(), list.end(), [](auto& a, auto& b) { return a.expiration_time < b.expiration_time; });
    auto chosen = std::find_if(list.begin(), list.end(), [](auto& t) { return t.signal > 0; });
    const TimerExpiry& t = chosen != list.end() ? *chosen : list.front();
    const int rank = owner_(pid);
    if (rank < 0) {
      if (refused_logged_++ < 10) {
        log::warn("ddprun") << "torchelastic timer '" << t.scope << "' expired for pid " << pid
                            << ", which is not a worker of this node: not signalled";
      }
      continue;
    }
    on_expired_(t, rank);
    if (t.signal > 0 && ::kill(pid, t.signal) != 0 && errno != ESRCH) {
      log::warn("ddprun") << "cannot send " << signal_name(t.signal) << " to pid " << pid << ": "
                          << std::strerror(errno);
    }
  }
}

void FileTimerServer::serve() {
  char buf[8192];
  for (;;) {
    pollfd fds[2] = {{read_fd_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
    // FileTimerServer's max_interval: timers are checked at least every 100 ms.
    const int r = ::poll(fds, 2, 100);
    if (r < 0 && errno != EINTR) {
      log::warn("ddprun") << "torchelastic timer server stopped: poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents) return;
    if (fds[0].revents & POLLIN) {
      for (;;) {
        const ssize_t n = ::read(read_fd_.get(), buf, sizeof buf);
        if (n <= 0) break;
        partial_.append(buf, static_cast<size_t>(n));
        for (auto nl = partial_.find('\n'); nl != std::string::npos; nl = partial_.find('\n')) {
          const std::string line = partial_.substr(0, nl);
          partial_.erase(0, nl + 1);
          if (line.empty()) continue;
          if (std::string why = handle_line(line); !why.empty()) {
            log::warn("ddprun") << "torchelastic timer: ignored a request (" << why << "): " << line.substr(0, 200);
          }
        }
        if (partial_.size() > kMaxLine) {
          log::warn("ddprun") << "torchelastic timer: dropped " << partial_.size() << " bytes without a newline";
          partial_.clear();
        }
      }
    }
    expire(wall_seconds());
  }
}

}  // namespace ddprun::launcher::watchdog
