#pragma once
// Test helper: a small tmpfs, for a full disk.

#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "tests/support/temp_dir.hpp"

namespace ddprun::test {

// A tmpfs of `size` mounted on a fresh directory, unmounted at scope exit. Needs CAP_SYS_ADMIN:
// `error` says why when it could not be mounted.
struct SmallDisk {
  TempDir dir;
  bool mounted = false;
  std::string error;
  explicit SmallDisk(const std::string& size) {
    const std::string opts = "size=" + size + ",mode=0700";
    mounted = ::mount("tmpfs", dir.str().c_str(), "tmpfs", 0, opts.c_str()) == 0;
    if (!mounted) error = std::strerror(errno);
  }
  ~SmallDisk() {
    if (mounted) ::umount2(dir.str().c_str(), MNT_DETACH);
  }
  // Writes a file until the disk says it is full.
  void fill() const {
    std::ofstream out(dir.path / "filler", std::ios::binary);
    const std::string block(64 * 1024, 'f');
    while (out.write(block.data(), static_cast<std::streamsize>(block.size()))) {
    }
  }
};

}  // namespace ddprun::test
