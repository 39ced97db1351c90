// The run directory (agent.hpp's RunDirectory): made, locked, kept or removed, and the
// temporary ones of killed ddprun processes swept.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/unique_fd.hpp"
#include "launcher/agent/agent.hpp"

namespace ddprun::launcher::agent {

namespace {

std::string random_suffix() {
  static const char* chars = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::mt19937 rng(std::random_device{}());
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(chars[rng() % 36]);
  return s;
}

}  // namespace

void create_private_directory(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec) fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec) throw ConfigError("cannot create the log directory " + dir.string() + ": " + ec.message());
}

namespace {

constexpr const char* kRunDirPrefix = "ddprun_";
constexpr const char* kLockFile = ".lock";
constexpr const char* kTemporaryMarker = ".temporary";

}  // namespace

int sweep_abandoned_run_directories(const fs::path& parent) {
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path dir = it->path();
    if (dir.filename().string().rfind(kRunDirPrefix, 0) != 0) continue;
    struct stat st {};
    // lstat: a link named like a run directory is not one; another user's directory is theirs.
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) continue;
    if (::access((dir / kTemporaryMarker).c_str(), F_OK) != 0) continue;
    const UniqueFd lock(::open((dir / kLockFile).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (lock && ::flock(lock.get(), LOCK_EX | LOCK_NB) == 0) {
      std::error_code rm;
      fs::remove_all(dir, rm);
      if (!rm) ++removed;
    }
  }
  return removed;
}

RunDirectory::RunDirectory(const LaunchOptions& o) {
  std::error_code ec;
  if (!o.log_dir.empty()) {
    path = fs::path(o.log_dir) / (o.run_id + "_" + random_suffix());
  } else {
    const fs::path parent = fs::temp_directory_path(ec);
    if (const int n = sweep_abandoned_run_directories(parent); n > 0) {
      log::info("ddprun") << "removed " << n << " run director" << (n == 1 ? "y" : "ies") << " under "
                          << parent.string() << " left by ddprun processes that were killed";
    }
    path = parent / (kRunDirPrefix + o.run_id + "_" + random_suffix());
    temporary =
        !o.redirects.any() && !o.tee.any() && o.duplicate_stdout_filters.empty() && o.duplicate_stderr_filters.empty();
  }
  create_private_directory(path);
  if (!temporary) return;
  // The lock first, then the marker: a marked directory always had its lock held by its owner.
  lock_fd_.reset(::open((path / kLockFile).c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (lock_fd_ && ::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) == 0) {
    const UniqueFd marker(  // created, closed at once
        ::open((path / kTemporaryMarker).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  }
}

RunDirectory::~RunDirectory() {
  std::error_code ec;
  if (temporary) fs::remove_all(path, ec);  // (the lock is released after: lock_fd_ goes last)
}

void RunDirectory::keep() {
  if (!temporary) return;
  temporary = false;
  std::error_code ec;
  fs::remove(path / kTemporaryMarker, ec);
  log::info("ddprun") << "keeping " << path.string() << " (stacks and reports)";
}

}  // namespace ddprun::launcher::agent
