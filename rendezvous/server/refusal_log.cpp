#include "rendezvous/server/refusal_log.hpp"

#include <algorithm>
#include <utility>

#include "common/log.hpp"

namespace ddprun::rdzv::server {

RefusalLog::RefusalLog(std::chrono::seconds window, std::string others, std::string note, size_t max_keys)
    : window_(window), note_(std::move(note)), max_keys_(max_keys) {
  others_.what = std::move(others);
}

void RefusalLog::note(const std::string& key, const std::string& line, const std::string& what, Clock::time_point now) {
  if (auto it = windows_.find(key); it != windows_.end()) {
    ++it->second.more;
    return;
  }
  if (windows_.size() >= max_keys_) {
    if (others_.more++ == 0) others_.since = now;
    return;
  }
  windows_.emplace(key, Window{now, 0, what});
  log::warn("store") << line;
}

void RefusalLog::flush(Clock::time_point now, bool all) {
  for (auto it = windows_.begin(); it != windows_.end();) {
    if (all || now - it->second.since >= window_) {
      if (it->second.more > 0) report(it->second, now);
      it = windows_.erase(it);
    } else {
      ++it;
    }
  }
  if (others_.more > 0 && (all || now - others_.since >= window_)) {
    report(others_, now);
    others_.more = 0;
  }
}

void RefusalLog::report(const Window& w, Clock::time_point now) const {
  const auto secs = std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::seconds>(now - w.since).count());
  log::warn("store") << w.more << " more " << w.what << " in the last " << secs << " s"
                     << (note_.empty() ? "" : " " + note_);
}

std::string peer_host(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

}  // namespace ddprun::rdzv::server
