#include "launcher/workers/worker_env.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "launcher/workers/numa.hpp"
#include "launcher/workers/output.hpp"
#include "launcher/workers/queued_writer.hpp"
#include "launcher/workers/report.hpp"

namespace ddprun::launcher {

using workers::AttemptContext;
using workers::ConsoleWriter;
using workers::Environment;
using workers::expand_prefix;
using workers::format_failure_report;
using workers::LineWriter;
using workers::QueuedWriter;
using workers::shell_exit_code;
using workers::substitute_args;
using workers::visible_gpu_ids;
using workers::worker_environment;
using workers::WorkerExit;
using workers::WorkerPlacement;
namespace {

TEST(WorkerEnvTest, SetsTorchrunContract) {
  WorkerPlacement where{.local_rank = 1,
                        .rank = 5,
                        .local_world_size = 4,
                        .world_size = 8,
                        .group_rank = 1,
                        .group_world_size = 2,
                        .role_rank = 3,  // a node of another role, with 2 workers, before this one
                        .role_world_size = 6};
  AttemptContext ctx;
  ctx.master_addr = "10.1.2.3";
  ctx.master_port = 41000;
  ctx.restart_count = 2;
  ctx.max_restarts = 3;
  ctx.run_id = "job";
  ctx.signals_to_handle = "SIGTERM,SIGINT";
  const Environment env =
      worker_environment({{"PATH", "/bin"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}}, where, ctx, "/e.json");
  const Environment expected_subset = {{"LOCAL_RANK", "1"},
                                       {"RANK", "5"},
                                       {"GROUP_RANK", "1"},
                                       {"ROLE_RANK", "3"},
                                       {"ROLE_NAME", "default"},
                                       {"LOCAL_WORLD_SIZE", "4"},
                                       {"WORLD_SIZE", "8"},
                                       {"GROUP_WORLD_SIZE", "2"},
                                       {"ROLE_WORLD_SIZE", "6"},
                                       {"MASTER_ADDR", "10.1.2.3"},
                                       {"MASTER_PORT", "41000"},
                                       {"TORCHELASTIC_RESTART_COUNT", "2"},
                                       {"TORCHELASTIC_MAX_RESTARTS", "3"},
                                       {"TORCHELASTIC_RUN_ID", "job"},
                                       {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                       {"TORCHELASTIC_ERROR_FILE", "/e.json"},
                                       {"NCCL_ASYNC_ERROR_HANDLING", "0"},
                                       {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"},
                                       {"PATH", "/bin"},
                                       {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT"}};
  for (const auto& [k, v] : expected_subset) EXPECT_EQ(env.at(k), v) << k;
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(worker_environment({}, where, ctx, "").at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
}

TEST(WorkerEnvTest, VirtualLocalRankGivesOneGpuEach) {
  const Environment base = {{"CUDA_VISIBLE_DEVICES", "3,5,7"}};
  AttemptContext ctx;
  ctx.one_gpu_each = visible_gpu_ids(base, 3);
  WorkerPlacement where;
  where.local_rank = 2;
  const Environment env = worker_environment(base, where, ctx, "");
  EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "7");
  EXPECT_EQ(env.at("LOCAL_RANK"), "0");
  EXPECT_EQ(visible_gpu_ids({}, 2), (std::vector<std::string>{"0", "1"}));
}

// AMD (ROCm): one GPU each through HIP_VISIBLE_DEVICES, among those HIP_VISIBLE_DEVICES shows; Intel
// through ZE_AFFINITY_MASK. CUDA_VISIBLE_DEVICES is left as it was.
TEST(WorkerEnvTest, VirtualLocalRankUsesEachVendorsVisibilityVariable) {
  const Environment amd = {{"HIP_VISIBLE_DEVICES", "1,2"}, {"ROCR_VISIBLE_DEVICES", "4,5,6"}};
  AttemptContext ctx;
  ctx.gpu_variable = "HIP_VISIBLE_DEVICES";
  ctx.one_gpu_each = visible_gpu_ids(amd, 2, ctx.gpu_variable);
  WorkerPlacement where;
  where.local_rank = 1;
  Environment env = worker_environment(amd, where, ctx, "");
  EXPECT_EQ(env.at("HIP_VISIBLE_DEVICES"), "2");
  EXPECT_EQ(env.at("ROCR_VISIBLE_DEVICES"), "4,5,6");
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(env.at("LOCAL_RANK"), "0");

  ctx.gpu_variable = "ZE_AFFINITY_MASK";
  ctx.one_gpu_each = visible_gpu_ids({}, 4, ctx.gpu_variable);
  where.local_rank = 3;
  env = worker_environment({}, where, ctx, "");
  EXPECT_EQ(env.at("ZE_AFFINITY_MASK"), "3");
}

TEST(WorkerEnvTest, SubstitutesLocalRankMacro) {
  EXPECT_EQ(substitute_args({"--dev=cuda:${local_rank}", "${local_rank}${local_rank}", "x"}, 3),
            (std::vector<std::string>{"--dev=cuda:3", "33", "x"}));
}

TEST(LineWriterTest, PrefixTemplateKnowsTorchrunsMacros) {
  // ${hostname} is torchrun 2.x's spelling; ${host} is kept for scripts written for ddprun.
  EXPECT_EQ(expand_prefix("${hostname}:${host}:${role_name}:${rank}:${local_rank}| ", 5, 1, "trainer", "node7"),
            "node7:node7:trainer:5:1| ");
  EXPECT_EQ(expand_prefix("${unknown} ${rank}", 2, 0, "r", "h"), "${unknown} 2");
}

// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE as torchrun 2.x expands it (Python's string.Template's
// safe_substitute): names with or without braces, $$ for a $, anything else left as it is.
TEST(LineWriterTest, PrefixTemplateIsExpandedAsPythonsStringTemplate) {
  EXPECT_EQ(expand_prefix("[$role_name$local_rank]:", 5, 1, "trainer", "h"), "[trainer1]:");
  EXPECT_EQ(expand_prefix("[rank$rank]: ", 5, 1, "t", "h"), "[rank5]: ");
  EXPECT_EQ(expand_prefix("$$rank ${rank}$$", 5, 1, "t", "h"), "$rank 5$");
  EXPECT_EQ(expand_prefix("$ranks $rank_x ${rank ${ranks} $ $5 $", 5, 1, "t", "h"),
            "$ranks $rank_x ${rank ${ranks} $ $5 $");
  EXPECT_EQ(expand_prefix("$rank.$local_rank-$hostname", 5, 1, "t", "node7"), "5.1-node7");
}

// A log file on a full disk (/dev/full answers every write with ENOSPC): output that went to the
// file only reaches the console from the failed write on, so no line is lost.
TEST(LineWriterTest, AFileThatCannotTakeMoreHandsItsLinesToTheConsole) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(full, 0) << std::strerror(errno);
  {
    ConsoleWriter console(fds[1]);
    LineWriter::Sinks sinks;
    sinks.console = &console;
    sinks.to_console = false;
    sinks.file_fd.reset(full);
    sinks.file_name = "rank 0's log file /dev/full";
    LineWriter w("[r0]: ", std::move(sinks), 0);
    w.feed("one\ntw");
    w.feed("o\n");
    w.finish();
    EXPECT_TRUE(console.drain(std::chrono::seconds(10)));
  }
  ::close(fds[1]);
  char buf[256];
  const ssize_t n = ::read(fds[0], buf, sizeof buf);
  ::close(fds[0]);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "[r0]: one\n[r0]: two\n");
}

TEST(LineWriterTest, PrefixesWholeLinesAndKeepsTail) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  {
    ConsoleWriter console(fds[1]);
    LineWriter::Sinks sinks;
    sinks.console = &console;
    LineWriter w(expand_prefix("[${role_name}${rank}/${local_rank}]: ", 7, 3, "trainer", "h"), std::move(sinks), 2);
    w.feed("first li");
    w.feed("ne\nsecond\nthi");
    w.feed("rd");
    w.finish();
    EXPECT_EQ(std::vector<std::string>(w.tail().begin(), w.tail().end()),
              (std::vector<std::string>{"second", "third"}));
    EXPECT_TRUE(console.drain(std::chrono::seconds(10)));
  }
  ::close(fds[1]);
  char buf[256];
  const ssize_t n = ::read(fds[0], buf, sizeof buf);
  ::close(fds[0]);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)),
            "[trainer7/3]: first line\n[trainer7/3]: second\n[trainer7/3]: third\n");
}

// --merge_lines: what several ranks wrote once, with their ranks as ranges; each rank's order kept.
TEST(LineMergerTest, IdenticalLinesOfSeveralRanksArePrintedOnceInEachRanksOrder) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  {
    ConsoleWriter console(fds[1]);
    {
      // A window no test reaches: everything is printed by the merger's end, in order.
      auto merger =
          std::make_shared<workers::LineMerger>(&console, std::chrono::minutes(1), "[rank${rank}]: ", "default", "h");
      std::vector<std::unique_ptr<LineWriter>> ranks;
      for (int r = 0; r < 4; ++r) {
        LineWriter::Sinks sinks;
        sinks.console = &console;
        sinks.merger = merger;
        sinks.rank = r;
        sinks.local_rank = r;
        ranks.push_back(std::make_unique<LineWriter>("[rank" + std::to_string(r) + "]: ", std::move(sinks), 0));
      }
      ranks[0]->feed("epoch 1\nloss 1.5\n");
      ranks[1]->feed("A\n");  // rank 1 says A first: its next lines cannot join rank 0's, printed before A
      ranks[1]->feed("epoch 1\nloss 1.5\n");
      ranks[3]->feed("epoch 1\nloss 1.5\n");
      ranks[2]->feed("only me\n");
      for (int r = 0; r < 3; ++r) ranks[static_cast<size_t>(r)]->feed("done\n");
      ranks[3]->feed("do");
      ranks[3]->feed("ne");
      ranks[3]->finish();
      merger->flush();
    }
    EXPECT_TRUE(console.drain(std::chrono::seconds(10)));
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  EXPECT_EQ(out,
            "[rank0,3]: epoch 1\n[rank0,3]: loss 1.5\n[rank1]: A\n[rank1]: epoch 1\n[rank1]: loss 1.5\n"
            "[rank2]: only me\n[rank0-3]: done\n");
  EXPECT_EQ(workers::format_cpu_list({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
}

TEST(ReportTest, NamesRootCauseWithSignalErrorFileAndTail) {
  char path[] = "/tmp/ddprun_report_XXXXXX";
  const int fd = ::mkstemp(path);
  const std::string json =
      R"({"message": {"message": "ValueError: bad batch", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\"", "timestamp": "1"}}})";
  ASSERT_EQ(::write(fd, json.data(), json.size()), static_cast<ssize_t>(json.size()));
  ::close(fd);
  WorkerExit first;
  first.rank = 3;
  first.local_rank = 1;
  first.host = "node-b";
  first.pid = 4242;
  first.signal = 9;
  first.stderr_tail = {"CUDA out of memory"};
  WorkerExit second;
  second.host = "node-a";
  second.pid = 17;
  second.exit_code = 1;
  second.error_file = path;
  workers::read_error_file(second);  // as the supervisor does when a worker ends
  const std::string r = format_failure_report("train.py", {first, second}, {1, 2});
  ::unlink(path);
  EXPECT_NE(r.find("train.py FAILED"), std::string::npos);
  const auto root = r.find("Root cause");
  EXPECT_LT(root, r.find("rank       : 3 (local_rank 1)"));
  EXPECT_NE(r.find("signal 9 (SIGKILL)"), std::string::npos);
  EXPECT_NE(r.find("host       : node-b"), std::string::npos);
  EXPECT_NE(r.find("| CUDA out of memory"), std::string::npos);
  EXPECT_NE(r.find("error      : ValueError: bad batch"), std::string::npos);
  EXPECT_NE(r.find("Traceback (most recent call last):"), std::string::npos);
  EXPECT_NE(r.find("Stopped by ddprun after the failure: ranks 1,2"), std::string::npos);
  EXPECT_EQ(shell_exit_code(first), 137);
  EXPECT_EQ(shell_exit_code(second), 1);
}

// A worker that died of PyTorch >= 2.4's libuv default: the report says what to do.
TEST(ReportTest, SaysWhatToDoAboutATorchWithoutLibuv) {
  WorkerExit e;
  e.exit_code = 1;
  e.stderr_tail = {"Traceback (most recent call last):",
                   "torch.distributed.DistStoreError: use_libuv was requested but PyTorch was build without libuv "
                   "support, run with USE_LIBUV=0 to disable it."};
  const std::string r = format_failure_report("train.py", {e}, {});
  EXPECT_NE(r.find("what to do : this PyTorch was built without libuv"), std::string::npos) << r;
  EXPECT_NE(r.find("use_libuv=False"), std::string::npos) << r;
  e.stderr_tail = {"ValueError: bad batch"};
  EXPECT_EQ(format_failure_report("train.py", {e}, {}).find("what to do"), std::string::npos);
}

// An error file and stderr lines with escape sequences: the report shows them, never sends them
// to the terminal to act on, and keeps UTF-8 text and tabs as they are.
TEST(ReportTest, WhatAWorkerWroteReachesTheConsoleWithItsControlCharactersShown) {
  WorkerExit e;
  e.exit_code = 1;
  e.host = "node-\x1b[8m";
  e.error_text = "RuntimeError: \x1b[2Jgone\r\n\tat step 3 \xc3\xa9t\xc3\xa9";
  e.stderr_tail = {"\x1b]0;pwned\x07title",
                   "\xc2\x9b"
                   "1A up a line",
                   "crlf\r"};
  const std::string r = format_failure_report("train.py", {e}, {});
  for (const char c : r) {
    const auto u = static_cast<unsigned char>(c);
    EXPECT_TRUE((u >= 0x20 && u != 0x7f) || c == '\n' || c == '\t')
        << "a control character " << static_cast<int>(u) << " in\n"
        << r;
  }
  EXPECT_EQ(r.find("\xc2\x9b"), std::string::npos) << r;
  EXPECT_NE(r.find("error      : RuntimeError: \\x1b[2Jgone\n"), std::string::npos) << r;
  EXPECT_NE(r.find("\tat step 3 \xc3\xa9t\xc3\xa9\n"), std::string::npos) << r;
  EXPECT_NE(r.find("| \\x1b]0;pwned\\x07title\n"), std::string::npos) << r;
  EXPECT_NE(r.find("| \\xc2\\x9b1A up a line\n"), std::string::npos) << r;
  EXPECT_NE(r.find("| crlf\n"), std::string::npos) << r;
  EXPECT_NE(r.find("host       : node-\\x1b[8m"), std::string::npos) << r;
}

// A console nobody reads: writes never block, the overflow is dropped and counted, said once.
TEST(ConsoleWriterTest, AConsoleNobodyReadsDropsInsteadOfBlocking) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);  // the read end stays open and unread
  // Fill the pipe first, so that the console's first write blocks.
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
  const std::string chunk(4096, 'f');
  while (::write(fds[1], chunk.data(), chunk.size()) > 0) {
  }
  ::fcntl(fds[1], F_SETFL, 0);
  int announced = 0;
  {
    ConsoleWriter console(fds[1], 64 * 1024, [&] { ++announced; });
    const std::string line(1000, 'x');
    for (int i = 0; i < 10000; ++i) console.write(line + "\n");  // 10 MB into a 64 KiB pipe
    EXPECT_GT(console.dropped_bytes(), 9'000'000u);
    EXPECT_FALSE(console.drain(std::chrono::milliseconds(50)));
  }  // the destructor gives up on the blocked write instead of hanging
  EXPECT_EQ(announced, 1);
  ::close(fds[0]);
  ::close(fds[1]);
}

// A file whose reader has gone: the owner is told once, with the error, and writes after it are
// dropped, never blocked on.
TEST(QueuedWriterTest, AFileThatFailsIsSaidOnceWithItsError) {
  ::signal(SIGPIPE, SIG_IGN);  // as ddprun does: the write fails with EPIPE instead
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);
  std::mutex mutex;
  std::vector<int> errors;
  QueuedWriter::Settings how;
  how.on_failure = [&](int err) {
    std::lock_guard lock(mutex);
    errors.push_back(err);
  };
  {
    QueuedWriter file(UniqueFd(fds[1]), std::move(how));
    file.write("first\n");
    EXPECT_TRUE(file.drain(std::chrono::seconds(30)));
    EXPECT_TRUE(file.failed());
    file.write("second\n");
  }
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], EPIPE);
  EXPECT_EQ(::fcntl(fds[1], F_GETFD), -1) << "the writer closes the descriptor it owns";
}

}  // namespace
}  // namespace ddprun::launcher
