#include "launcher/workers/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ddprun::launcher::workers {

OpenedOutput open_output(const std::string& path, OutputRules rules) {
  OpenedOutput out;
  auto fail = [&](std::string why) {
    out.fd.reset();
    out.error = std::move(why);
    return std::move(out);
  };
  // O_NONBLOCK: a FIFO without a reader fails at once (ENXIO). O_NOFOLLOW: a link at the end of
  // the path is refused (ELOOP). No O_TRUNC: only a file found to be this user's is emptied.
  const int flags = O_WRONLY | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC | (rules.append ? O_APPEND : 0);
  out.fd.reset(::open(path.c_str(), flags, 0600));
  if (!out.fd) {
    const int err = errno;
    if (err == ENXIO) return fail("it is a FIFO that no process reads: start its reader first, or give a file path");
    if (err == ELOOP) {
      return fail(
          "it is a symbolic link, which ddprun does not write through (anyone who can write its directory "
          "could have planted it): give the path of the file itself");
    }
    return fail(std::string("cannot create it: ") + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(out.fd.get(), &st) != 0) return fail(std::string("cannot stat it: ") + std::strerror(errno));
  if (S_ISREG(st.st_mode)) {
    if (st.st_uid != ::geteuid()) {
      return fail("it is another user's file (uid " + std::to_string(st.st_uid) +
                  "), which ddprun does not overwrite: give a path of your own");
    }
    if (!rules.append && ::ftruncate(out.fd.get(), 0) != 0) {
      return fail(std::string("cannot empty it: ") + std::strerror(errno));
    }
  } else if (rules.regular_only) {
    return fail("it is not a regular file (a FIFO or a device was put there), which ddprun does not write to");
  }
  const int now = ::fcntl(out.fd.get(), F_GETFL);
  if (now < 0 || ::fcntl(out.fd.get(), F_SETFL, now & ~O_NONBLOCK) != 0) {
    return fail(std::string("cannot make it blocking: ") + std::strerror(errno));
  }
  return out;
}

}  // namespace ddprun::launcher::workers
