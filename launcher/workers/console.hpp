#pragma once
// ddprun's console: its stdout and stderr, each written by a QueuedWriter (queued_writer.hpp) so
// that a console that does not keep up (a pipe nobody reads, a terminal scrolled back, a stopped
// pager) never blocks supervision: the supervisor queues whole lines and goes on reaping,
// forwarding signals and watching other nodes; when the console falls too far behind, new batches
// are dropped and counted, and the agent says so once.

#include "launcher/workers/queued_writer.hpp"

namespace ddprun::launcher::workers {

using ConsoleWriter = QueuedWriter;

// The two consoles of this process, set by the agent for as long as it runs (null otherwise:
// callers then write directly). ddprun's own log lines go through the stderr writer too (see
// log::set_sink), so that they never block supervision either.
struct Consoles {
  ConsoleWriter* out = nullptr;
  ConsoleWriter* err = nullptr;
};
Consoles& consoles();

}  // namespace ddprun::launcher::workers
