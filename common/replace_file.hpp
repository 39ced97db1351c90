#pragma once
// Replacing a file's contents, one way for every file ddprun writes whole (the report, the
// daemon's state snapshot, port and token files, the job pages' registry, the SDK's checkpoints):
// the bytes go to a temporary file of a unique name in the same directory, which is closed (with
// Durability::Durable, fsynced first) and renamed over the target, so that a reader sees the old
// file or the new one, whole, never a part; Durable also fsyncs the directory after, so that the
// new file survives a crash of the machine. On any failure the temporary file is removed and the
// old file stays as it was. Header-only: the worker SDK's checkpoints use it too.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/system.hpp"
#include "common/unique_fd.hpp"

namespace ddprun {

enum class Durability {
  Atomic,   // readers see the old file or the new one (a file others poll: a report, a port)
  Durable,  // that, and the new file survives a power loss once replace_file returns
};

struct ReplaceFile {
  Durability durability = Durability::Durable;
  mode_t mode = 0600;             // the new file's permissions
  bool create_directory = false;  // make the directory (and its parents) first
  // Called once the bytes are written, before the rename: a reason not to publish (the old file
  // stays), or nullopt.
  std::function<std::optional<std::string>()> before_publish;
};

// Why a replacement failed: the step ("writing /d/.f.tmp.a1B2c3"; a before_publish reason) and
// errno (0 for a before_publish reason).
struct FileWriteError {
  std::string step;
  int err = 0;
  // "writing /d/.f.tmp.a1B2c3: No space left on device"
  inline std::string what() const;
};

// nullopt once `path` holds `data`.
inline std::optional<FileWriteError> replace_file(const std::string& path, std::string_view data,
                                                  const ReplaceFile& how = {});

inline std::string FileWriteError::what() const { return err == 0 ? step : step + ": " + std::strerror(err); }

inline std::optional<FileWriteError> replace_file(const std::string& path, std::string_view data,
                                                  const ReplaceFile& how) {
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  if (how.create_directory) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return FileWriteError{"creating the directory " + dir.string(), ec.value()};
  }
  // Hidden, and unique: two writers of one path never share a temporary file.
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  UniqueFd fd(::mkostemp(tmp.data(), O_CLOEXEC));  // 0600
  if (!fd) return FileWriteError{"creating a temporary file in " + dir.string(), errno};
  auto abandon = [&](std::string step, int err) {
    fd.reset();
    ::unlink(tmp.c_str());
    return FileWriteError{std::move(step), err};
  };
  if (how.mode != 0600 && ::fchmod(fd.get(), how.mode) != 0) return abandon("setting the mode of " + tmp, errno);
  if (!write_all(fd.get(), data)) return abandon("writing " + tmp, errno != 0 ? errno : ENOSPC);
  if (how.durability == Durability::Durable && ::fsync(fd.get()) != 0) return abandon("fsync of " + tmp, errno);
  if (fd.close() != 0) return abandon("closing " + tmp, errno);
  if (how.before_publish) {
    if (auto reason = how.before_publish()) return abandon(std::move(*reason), 0);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return abandon("renaming " + tmp + " over " + path, errno);
  if (how.durability == Durability::Durable) {
    const UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dfd) return FileWriteError{"opening " + dir.string() + " to fsync the rename", errno};
    if (::fsync(dfd.get()) != 0) return FileWriteError{"fsync of the directory " + dir.string(), errno};
  }
  return std::nullopt;
}

}  // namespace ddprun
