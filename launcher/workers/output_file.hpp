#pragma once
// Opening a file ddprun writes for a person (the trace, a rank's log, the filtered copy): never
// blocking (a FIFO nobody reads fails at once instead of holding open() until a reader comes), never
// through a symbolic link at the path's end (one planted in a shared directory would have ddprun
// overwrite its target), and emptying only a regular file of this user's. Pure system calls; no
// threads.

#include <string>

#include "common/unique_fd.hpp"

namespace ddprun::launcher::workers {

struct OutputRules {
  // A regular file only (a log in ddprun's own directory): anything else there was planted.
  // Otherwise a FIFO with its reader, a terminal or a device is written as it is.
  bool regular_only = false;
  bool append = false;  // keep what a regular file holds (else it is emptied)
};

struct OpenedOutput {
  UniqueFd fd;        // blocking again once opened (it is written by a thread that may wait)
  std::string error;  // when !fd: why, a phrase ("it is a FIFO that no process reads: ...")
};

OpenedOutput open_output(const std::string& path, OutputRules rules = {});

}  // namespace ddprun::launcher::workers
