#pragma once
// Where the running ddprun's of this user on this host say their HTTP port, so that
// `ddprun-top RUN_ID` (or `ddprun-top` alone) finds a job without being told the port: one file per
// ddprun started with --http_port, `<dir>/<pid>.json` = {"pid", "port", "run_id", "program"},
// written when its server listens and removed when it exits. A file whose pid no longer runs is
// stale (a ddprun that was SIGKILLed) and skipped, and removed by the next ddprun that looks.
// <dir>: $XDG_RUNTIME_DIR/ddprun-pages, else /tmp/ddprun-pages-<uid>; private to the user (0700),
// and one that another user owns is not used.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::job_pages {

struct Entry {
  pid_t pid = 0;
  uint16_t port = 0;
  std::string run_id;
  std::string program;
};

// The directory (created if missing); "" when it cannot be made or is not this user's own.
std::string directory();
// Says this process serves on `port`; returns the file written ("" when it could not be: the job
// runs on, and ddprun-top needs the port).
std::string publish(uint16_t port, const std::string& run_id, const std::string& program);
// The running ddprun's of this user, oldest first; stale files are removed.
std::vector<Entry> list();

}  // namespace ddprun::job_pages
