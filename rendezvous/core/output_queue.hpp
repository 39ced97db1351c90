#pragma once
// The bytes one connection owes its client, in order. Small fields are copied; a value of
// kShareAtLeast bytes or more is not copied but referenced: the queue holds a share of the stored
// string, so a reply that carries a value costs the value's length in bookkeeping, not in memory.
// MULTI_GET of one 8 MiB key 2000 times therefore queues 2000 references to one string, and
// pipelined GETs of it likewise; the store's values are immutable once shared (see KvStore).
//
// Not thread-safe (the connection's thread). An empty queue holds no heap memory.

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::rdzv::core {

// A stored value handed out without a copy; never modified while anyone else holds it.
using SharedBytes = std::shared_ptr<const std::string>;

class OutputQueue {
 public:
  static constexpr size_t kShareAtLeast = 1024;

  void put_u8(uint8_t value);
  void put_u32(uint32_t value);
  void put_u64(uint64_t value);
  void put_i64(int64_t value) { put_u64(static_cast<uint64_t>(value)); }
  // u64 length + the bytes, copied.
  void put_bytes(std::string_view bytes);
  // u64 length + the value; referenced, not copied, when it is large. A null value is empty.
  void put_value(const SharedBytes& value);

  // Bytes owed to the client.
  size_t size() const { return size_; }
  // Of them, those copied into the queue (the memory it holds of its own; shares are the store's).
  size_t owned() const { return size_ - shared_; }
  bool empty() const { return size_ == 0; }
  // Describes up to `max` buffers from the front of the queue, for writev; returns how many.
  size_t gather(iovec* iov, size_t max) const;
  // Drops the first `n` bytes (sent).
  void consume(size_t n);
  void clear();
  // Everything owed, as one string (tests, and the fuzzer).
  std::string take_all();

 private:
  struct Segment {
    std::string own;
    SharedBytes shared;
    size_t offset = 0;  // bytes already sent
    const char* data() const { return (shared ? shared->data() : own.data()) + offset; }
    size_t size() const { return (shared ? shared->size() : own.size()) - offset; }
  };
  std::string& tail();

  // A vector with a moving head rather than a deque: std::deque allocates even when empty, which
  // thousands of idle connections would pay for.
  std::vector<Segment> segments_;
  size_t head_ = 0;
  size_t size_ = 0;
  size_t shared_ = 0;  // of size_, the bytes of shared segments
};

}  // namespace ddprun::rdzv::core
