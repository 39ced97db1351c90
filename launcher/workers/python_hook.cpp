#include "launcher/workers/python_hook.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "common/errors.hpp"
#include "common/system.hpp"
#include "common/unique_fd.hpp"

namespace ddprun::launcher::workers {

namespace {

void write_private_file(const std::string& path, std::string_view text) {
  // Readable by its owner alone, like everything else in ddprun's run directory.
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) throw ProcessError("cannot write " + path + ": " + std::strerror(errno));
  if (!write_all(fd.get(), text)) throw ProcessError("cannot write " + path + ": " + std::strerror(errno));
  if (fd.close() != 0) throw ProcessError("cannot write " + path + ": " + std::strerror(errno));
}

}  // namespace

void write_python_hook(const std::string& dir, bool fault_tolerance) {
  write_private_file(dir + "/sitecustomize.py", python_hook_source());
  if (fault_tolerance) write_private_file(dir + "/ddprun_ft.py", python_ft_source());
}

}  // namespace ddprun::launcher::workers
