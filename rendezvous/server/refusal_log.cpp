#include "rendezvous/server/refusal_log.hpp"

#include <algorithm>

#include "common/log.hpp"

namespace ddprun::rdzv::server {

RefusalLog::RefusalLog(std::chrono::seconds window, size_t max_addresses)
    : window_(window), max_addresses_(max_addresses) {}

void RefusalLog::refused(const std::string& address, const std::string& line, Clock::time_point now) {
  if (auto it = windows_.find(address); it != windows_.end()) {
    ++it->second.more;
    return;
  }
  if (windows_.size() >= max_addresses_) {
    if (others_.more++ == 0) others_.since = now;
    return;
  }
  windows_.emplace(address, Window{now, 0});
  log::warn("store") << line;
}

void RefusalLog::flush(Clock::time_point now, bool all) {
  for (auto it = windows_.begin(); it != windows_.end();) {
    if (all || now - it->second.since >= window_) {
      if (it->second.more > 0) report("from " + it->first, it->second, now);
      it = windows_.erase(it);
    } else {
      ++it;
    }
  }
  if (others_.more > 0 && (all || now - others_.since >= window_)) {
    report("from other addresses (more than " + std::to_string(max_addresses_) + " refused at once)", others_, now);
    others_ = Window{};
  }
}

void RefusalLog::report(const std::string& from, const Window& w, Clock::time_point now) const {
  const auto secs = std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::seconds>(now - w.since).count());
  log::warn("store") << w.more << " more refused connections " << from << " in the last " << secs
                     << " s (failed or missing handshakes, requests outside a client's job)";
}

std::string peer_host(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

}  // namespace ddprun::rdzv::server
