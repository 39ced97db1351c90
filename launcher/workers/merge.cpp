#include "launcher/workers/merge.hpp"

#include <algorithm>

#include "launcher/workers/numa.hpp"
#include "launcher/workers/output.hpp"

namespace ddprun::launcher::workers {

LineMerger::LineMerger(ConsoleWriter* console, std::chrono::milliseconds window, std::string prefix_template,
                       std::string role, std::string host)
    : console_(console),
      window_(window),
      template_(std::move(prefix_template)),
      role_(std::move(role)),
      host_(std::move(host)) {
  thread_ = std::thread([this] { loop(); });
}

LineMerger::~LineMerger() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::lock_guard lock(mutex_);
  emit(true, std::chrono::steady_clock::now());
}

void LineMerger::add(int rank, int local_rank, std::string_view line) {
  std::lock_guard lock(mutex_);
  const uint64_t after = last_seq_[rank];  // 0: none yet
  // The oldest waiting line of this text that the rank has not said and that comes after the
  // rank's own latest line (so its lines keep their order): ranks printing the same lines join
  // them one by one.
  auto it = std::find_if(waiting_.begin(), waiting_.end(),
                         [&](const Entry& e) { return e.seq > after && e.text == line && e.ranks.count(rank) == 0; });
  if (it != waiting_.end()) {
    it->ranks.insert(rank);
    it->local_ranks.insert(local_rank);
    last_seq_[rank] = it->seq;
    return;
  }
  Entry e;
  e.seq = next_seq_++;
  e.text = std::string(line);
  e.ranks.insert(rank);
  e.local_ranks.insert(local_rank);
  e.first = std::chrono::steady_clock::now();
  last_seq_[rank] = e.seq;
  waiting_.push_back(std::move(e));
  cv_.notify_all();
}

void LineMerger::flush() {
  std::lock_guard lock(mutex_);
  emit(true, std::chrono::steady_clock::now());
}

void LineMerger::emit(bool all, std::chrono::steady_clock::time_point now) {
  std::string batch;
  while (!waiting_.empty() && (all || waiting_.front().first + window_ <= now)) {
    const Entry& e = waiting_.front();
    // Ranks as the kernel writes CPU lists: "0-3,6".
    batch += expand_prefix_text(template_, format_cpu_list(e.ranks), format_cpu_list(e.local_ranks), role_, host_);
    batch += e.text;
    batch += '\n';
    waiting_.pop_front();
  }
  if (!batch.empty() && console_) console_->write(batch);
}

void LineMerger::loop() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (waiting_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const auto due = waiting_.front().first + window_;
    if (cv_.wait_until(lock, due) == std::cv_status::timeout || std::chrono::steady_clock::now() >= due) {
      emit(false, std::chrono::steady_clock::now());
    }
  }
}

}  // namespace ddprun::launcher::workers
