// Stack capture (launcher/watchdog/stacks) of real Python and native processes.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <thread>

#include "launcher/watchdog/stacks.hpp"
#include "launcher/workers/process.hpp"
#include "launcher/workers/python_hook.hpp"
#include "launcher/workers/worker_env.hpp"
#include "common/procfs.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::launcher {

using namespace watchdog;  // the code under test
using namespace workers;   // the processes it captures: spawned as the agent spawns its workers
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

TEST(StacksTest, APythonWorkersTracebackAndANativeProcesssFramesAreCaptured) {
  if (::access(TORCH_PYTHON, X_OK) != 0) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  test::TempDir dir;
  write_python_hook(dir.str());
  SpawnRequest req;
  req.argv = {TORCH_PYTHON, "-c",
              "import time, sys\ndef waiting_for_godot():\n    print('ready', flush=True)\n    time.sleep(60)\n"
              "waiting_for_godot()\n"};
  Environment env = current_environment();
  env["PYTHONPATH"] = dir.str();
  env["DDPRUN_STACK_DIR"] = dir.str();
  env["DDPRUN_STACK_SIGNAL"] = std::to_string(stack_signal());
  req.envp = to_envp(env);
  SpawnedProcess p = spawn_process(req);
  char buf[16];
  ASSERT_GT(::read(p.stdout_fd.get(), buf, sizeof buf), 0);  // "ready": armed and asleep
  const RankStacks s = capture_stacks(p.pid, p.pid, procfs::process_tree(p.pid), dir.str(), 10s);
  // Asleep in it, or (signalled a moment early) still printing from it.
  EXPECT_NE(s.python.find(" in waiting_for_godot"), std::string::npos) << s.python;
  if (s.native_tool.empty()) {
    EXPECT_FALSE(s.problems.empty());
  } else {
    EXPECT_NE(s.native.find("TID " + std::to_string(p.pid)), std::string::npos) << s.native;
  }
  // The process is unharmed: the signal only wrote its tracebacks.
  EXPECT_EQ(::kill(p.pid, 0), 0);
  ::kill(p.pid, SIGKILL);
  ::waitpid(p.pid, nullptr, 0);
}

TEST(StacksTest, AProcessThatNeverArmedIsNotSignalled) {
  test::TempDir dir;
  SpawnRequest req;
  req.argv = {"/bin/sleep", "60"};
  req.envp = to_envp(current_environment());
  SpawnedProcess p = spawn_process(req);
  const RankStacks s = capture_stacks(p.pid, p.pid, {p.pid}, dir.str(), 5s);
  EXPECT_TRUE(s.python.empty());
  EXPECT_EQ(::kill(p.pid, 0), 0) << "a real-time signal would have killed it";
  ::kill(p.pid, SIGKILL);
  ::waitpid(p.pid, nullptr, 0);
}

TEST(StacksTest, FirstLinesSaysHowManyWereLeftOut) {
  EXPECT_EQ(first_lines("a\nb\nc\n", 2), "a\nb\n... (1 more lines)\n");
  EXPECT_EQ(first_lines("a\nb\n", 5), "a\nb\n");
}

// --- torchelastic's file timer ------------------------------------------------------------------

}  // namespace
}  // namespace ddprun::launcher
