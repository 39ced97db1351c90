#pragma once
// A file descriptor with one owner: closed when the owner goes, moved (never copied) to a new
// one. -1 is "none". close() is for the callers that must know whether the close succeeded
// (a file whose data must be on disk); the destructor ignores the result, as it must.
//   UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
//   if (!fd) ... errno ...;
//   ::read(fd.get(), ...);
// Not for a forked child before exec: it closes by hand, with nothing but async-signal-safe calls.

#include <unistd.h>

#include <utility>

namespace ddprun {

class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  // Gives the descriptor up without closing it.
  int release() noexcept { return std::exchange(fd_, -1); }
  // Closes the one held (if any) and holds `fd`.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0 && fd_ != fd) ::close(fd_);
    fd_ = fd;
  }
  // Closes the one held; 0, or -1 with errno (also when none was held: EBADF).
  int close() noexcept { return ::close(release()); }

 private:
  int fd_ = -1;
};

}  // namespace ddprun
