#pragma once
// --preload: a Python interpreter per node (the zygote, python_zygote/zygote.py) that imports the
// given modules once; each Python worker is then forked from it instead of exec'd, and runs its
// program as __main__ with its own pid, process group, stdio, environment, argv, working
// directory, CPU placement and random state. The zygote forks twice and the middle process exits,
// so a worker's parent is ddprun (a child subreaper): ddprun reaps it, sees its exit status or
// signal, reads its error file and stacks, and signals its process group exactly as for an exec'd
// worker. The zygote itself is one of ddprun's process groups under the orphan guard, with
// PR_SET_PDEATHSIG, like a worker; restarts fork from the same zygote (no new import).
//
// Starting it does not wait: the imports run while the rendezvous does, and the first spawn()
// waits for them. When they fail, or leave more than one thread, the zygote says why and ddprun
// starts workers the normal way.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.hpp"
#include "launcher/workers/process.hpp"

namespace ddprun::launcher::workers {

class Zygote {
 public:
  // Starts `python` (PYTHON_EXEC) with `envp` (the job's environment, ddprun's Python hook on
  // PYTHONPATH) to import `modules`; listens on `socket_path` (in ddprun's private run directory).
  // Throws ProcessError when the interpreter cannot be started.
  Zygote(const std::string& python, const std::vector<std::string>& modules, std::vector<std::string> envp,
         const std::string& socket_path, OrphanGuard* guard);
  ~Zygote();  // the zygote exits (its socket closes) and is reaped; running workers are untouched
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  // Waits (up to `timeout`) until the modules are imported. False, with why() set, when the
  // zygote cannot serve: an import failed, it holds threads, it died or took too long.
  bool ready(std::chrono::milliseconds timeout);
  const std::string& why() const { return why_; }
  double import_seconds() const { return import_seconds_; }
  pid_t pid() const { return pid_; }

  // Forks one worker running req.argv (python -u [-m] PROGRAM ARGS...) with req.envp, this
  // process's working directory and stdin, and req's placement. Throws ProcessError when the
  // zygote cannot (it died, it refused); the caller then starts the worker the normal way.
  SpawnedProcess spawn(const SpawnRequest& req);

 private:
  void fail(const std::string& why);
  // Reads what the zygote printed before it was ready (import warnings) and hands it to ddprun's
  // stderr; false when its pipes are closed.
  void relay_output(UniqueFd& fd);
  std::string receive(std::chrono::milliseconds timeout);
  // The steps of ready(): the interpreter's connection (checked to come from the zygote's pid),
  // relaying its output meanwhile; its answer once the imports are done (throws ProcessError); what
  // it printed before it went quiet.
  bool accept_zygote(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout);
  std::string await_answer(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout);
  void drain_output();

  std::string socket_path_;
  OrphanGuard* guard_;
  pid_t pid_ = -1;
  UniqueFd listen_fd_;
  UniqueFd sock_;
  UniqueFd out_fd_, err_fd_;
  bool ready_known_ = false, ready_ = false;
  std::string why_;
  double import_seconds_ = 0;
  std::string pending_out_;
};

// The text of python_zygote/zygote.py, built in (zygote_source.cpp, made by CMake).
const char* zygote_source();

}  // namespace ddprun::launcher::workers
