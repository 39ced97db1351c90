#include "ddprun/worker/progress.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "common/unique_fd.hpp"
#include "ddprun/worker/env_contract.hpp"
#include "ddprun/worker/progress_page.hpp"

namespace ddprun::worker {
namespace {

uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// The page ddprun gave this rank, mapped on first use; nullptr when there is none (not under
// ddprun, or a file that is not a progress page): every call is then a no-op.
ProgressPage* page() {
  static ProgressPage* const mapped = []() -> ProgressPage* {
    const char* path = std::getenv(env_names::kProgressFile);
    if (!path || !*path) return nullptr;
    const UniqueFd fd(::open(path, O_RDWR | O_CLOEXEC));
    if (!fd) return nullptr;
    struct stat st {};
    void* p = MAP_FAILED;
    if (::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_size >= static_cast<off_t>(ProgressPage::kFileSize)) {
      p = ::mmap(nullptr, ProgressPage::kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    }
    if (p == MAP_FAILED) return nullptr;
    auto* pg = static_cast<ProgressPage*>(p);
    if (pg->magic.load(std::memory_order_acquire) != ProgressPage::kMagic) {
      ::munmap(p, ProgressPage::kFileSize);
      return nullptr;
    }
    pg->pid.store(::getpid(), std::memory_order_relaxed);
    return pg;
  }();
  return mapped;
}

std::atomic<int> g_wait_depth{0};

}  // namespace

void progress() {
  if (ProgressPage* p = page()) p->beats.fetch_add(1, std::memory_order_relaxed);
}

void step_completed() {
  if (ProgressPage* p = page()) {
    const uint64_t now = monotonic_ns();
    if (p->first_step_ns.load(std::memory_order_relaxed) == 0) {
      p->first_step_wait_ns.store(p->wait_ns.load(std::memory_order_relaxed), std::memory_order_relaxed);
      p->first_step_ns.store(now, std::memory_order_relaxed);
    }
    p->last_step_ns.store(now, std::memory_order_relaxed);
    p->steps.fetch_add(1, std::memory_order_release);
    p->beats.fetch_add(1, std::memory_order_relaxed);
  }
}

void report_iterations(uint64_t completed) {
  if (ProgressPage* p = page()) p->iterations.store(completed, std::memory_order_relaxed);
}

bool exclude_this_node(const std::string& reason) {
  const char* path = std::getenv(env_names::kExcludeNodeFile);
  if (!path || !*path) return false;
  std::string line = reason.substr(0, reason.find('\n'));
  line += '\n';
  const UniqueFd fd(::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  return fd && ::write(fd.get(), line.data(), line.size()) == static_cast<ssize_t>(line.size());
}

std::optional<std::chrono::milliseconds> membership_lapsed() {
  ProgressPage* p = page();
  if (!p) return std::nullopt;
  const uint64_t until = p->membership_until_ns.load(std::memory_order_acquire);
  const uint64_t now = monotonic_ns();
  if (until == 0 || now <= until) return std::nullopt;
  return std::chrono::milliseconds((now - until) / 1'000'000ULL);
}

CollectiveWait::CollectiveWait() : outermost_(g_wait_depth.fetch_add(1, std::memory_order_acq_rel) == 0) {
  if (!outermost_) return;
  if (ProgressPage* p = page()) p->waiting_since_ns.store(monotonic_ns(), std::memory_order_relaxed);
}

CollectiveWait::~CollectiveWait() {
  g_wait_depth.fetch_sub(1, std::memory_order_acq_rel);
  if (!outermost_) return;
  if (ProgressPage* p = page()) {
    const uint64_t since = p->waiting_since_ns.exchange(0, std::memory_order_relaxed);
    if (since != 0) {
      const uint64_t now = monotonic_ns();
      if (now > since) p->wait_ns.fetch_add(now - since, std::memory_order_relaxed);
    }
  }
}

}  // namespace ddprun::worker
