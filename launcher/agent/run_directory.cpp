// The run directory (agent.hpp's RunDirectory): made, locked, kept or removed, and the
// temporary ones of killed ddprun processes swept.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

// Why `dir` is not safe to hold a run directory, or "": owned by a user other than root or this one,
// or writable by a group or by others without the sticky bit (they could rename what is in it and
// put their own in its place), as ssh judges ~/.ssh.
std::string unsafe_because(const fs::path& dir, const struct stat& st) {
  if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
    return dir.string() + " belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  }
  if (S_ISDIR(st.st_mode) && (st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return dir.string() + " is writable by " + ((st.st_mode & S_IWOTH) != 0 ? "every user" : "its group") +
           " without the sticky bit";
  }
  return "";
}

// `dir` (which exists) and every directory above it, by the path as given and as resolved, are
// this user's or root's and writable by nobody else; else a ConfigError that says what to do.
void check_parents(const fs::path& dir, const std::string& what) {
  std::error_code ec;
  const fs::path given = fs::absolute(dir, ec);
  const fs::path resolved = fs::canonical(dir, ec);
  if (ec) throw ConfigError("cannot resolve the " + what + " " + dir.string() + ": " + ec.message());
  for (const fs::path& path : {given, resolved}) {
    fs::path prefix;
    for (const fs::path& part : path) {
      prefix /= part;
      struct stat st {};
      // lstat: a link in the path is judged as a link (its owner), and its target below as a path.
      if (::lstat(prefix.c_str(), &st) != 0) continue;
      if (const std::string why = unsafe_because(prefix, st); !why.empty()) {
        throw ConfigError("the " + what + " " + dir.string() + " is not safe for ddprun's run directory: " + why +
                          ", so another user could replace what the workers run from it; use a directory of "
                          "your own that only you can write (chmod go-w, or a sticky one like /tmp)");
      }
    }
  }
}

// --log_dir and the directories above it that are missing, each made 0700 (so a new one is safe).
void make_log_dir(const fs::path& dir) {
  std::error_code ec;
  fs::path prefix;
  for (const fs::path& part : fs::absolute(dir, ec)) {
    prefix /= part;
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) continue;
    if (errno != ENOENT || (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST)) {
      throw ConfigError("cannot create the log directory " + dir.string() + " (at " + prefix.string() +
                        "): " + std::strerror(errno));
    }
  }
}

// Makes the run directory itself: mkdir, which follows no link and fails if anything is there,
// then checked to be a directory of this user's, 0700.
void make_run_directory(const fs::path& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0) {
    throw ConfigError("cannot create the run directory " + dir.string() + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 0777) != 0700) {
    throw ConfigError("the run directory " + dir.string() + " was replaced as it was created; not using it");
  }
}

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
    make_log_dir(o.log_dir);
    check_parents(o.log_dir, "--log_dir");
    path = fs::path(o.log_dir) / (o.run_id + "_" + random_suffix());
  } else {
    const fs::path parent = fs::temp_directory_path(ec);
    check_parents(parent, "temporary directory (TMPDIR)");
    if (const int n = sweep_abandoned_run_directories(parent); n > 0) {
      log::info("ddprun") << "removed " << n << " run director" << (n == 1 ? "y" : "ies") << " under "
                          << parent.string() << " left by ddprun processes that were killed";
    }
    path = parent / (kRunDirPrefix + o.run_id + "_" + random_suffix());
    temporary =
        !o.redirects.any() && !o.tee.any() && o.duplicate_stdout_filters.empty() && o.duplicate_stderr_filters.empty();
  }
  make_run_directory(path);
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
