#include "rendezvous/core/output_queue.hpp"

#include <cstring>

namespace ddprun::rdzv::core {
namespace {

// Copied segments stop growing here, so sending the front of one never moves a large tail.
constexpr size_t kSegmentBytes = size_t{64} << 10;

}  // namespace

std::string& OutputQueue::tail() {
  if (head_ == segments_.size() || segments_.back().shared || segments_.back().own.size() >= kSegmentBytes) {
    segments_.emplace_back();
  }
  return segments_.back().own;
}

void OutputQueue::put_u8(uint8_t value) {
  tail().push_back(static_cast<char>(value));
  size_ += 1;
}

void OutputQueue::put_u32(uint32_t value) {
  char b[4];
  std::memcpy(b, &value, 4);
  tail().append(b, 4);
  size_ += 4;
}

void OutputQueue::put_u64(uint64_t value) {
  char b[8];
  std::memcpy(b, &value, 8);
  tail().append(b, 8);
  size_ += 8;
}

void OutputQueue::put_bytes(std::string_view bytes) {
  put_u64(bytes.size());
  if (bytes.empty()) return;
  tail().append(bytes.data(), bytes.size());
  size_ += bytes.size();
}

void OutputQueue::put_value(const SharedBytes& value) {
  if (!value || value->size() < kShareAtLeast) {
    put_bytes(value ? std::string_view(*value) : std::string_view());
    return;
  }
  put_u64(value->size());
  Segment s;
  s.shared = value;
  segments_.push_back(std::move(s));
  size_ += value->size();
  shared_ += value->size();
}

size_t OutputQueue::gather(iovec* iov, size_t max) const {
  size_t n = 0;
  for (size_t i = head_; i < segments_.size() && n < max; ++i) {
    const Segment& s = segments_[i];
    if (s.size() == 0) continue;
    iov[n].iov_base = const_cast<char*>(s.data());
    iov[n].iov_len = s.size();
    ++n;
  }
  return n;
}

void OutputQueue::consume(size_t n) {
  size_ -= n;
  while (n > 0 && head_ < segments_.size()) {
    Segment& s = segments_[head_];
    const size_t take = std::min(n, s.size());
    if (s.shared) shared_ -= take;
    s.offset += take;
    n -= take;
    if (s.size() == 0) segments_[head_++] = Segment();  // drops the copy or the share now
  }
  if (head_ == segments_.size()) {
    clear();
  } else if (head_ > 32 && head_ * 2 > segments_.size()) {
    segments_.erase(segments_.begin(), segments_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
}

void OutputQueue::clear() {
  // Frees the memory as well: a drained connection keeps nothing.
  std::vector<Segment>().swap(segments_);
  head_ = 0;
  size_ = 0;
  shared_ = 0;
}

std::string OutputQueue::take_all() {
  std::string out;
  out.reserve(size_);
  for (size_t i = head_; i < segments_.size(); ++i) out.append(segments_[i].data(), segments_[i].size());
  clear();
  return out;
}

}  // namespace ddprun::rdzv::core
