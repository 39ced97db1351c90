// The worker SDK end to end: sdk_test_worker (LibTorch) under the real ddprun, 2 and 3 processes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cstddef>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "ddprun/worker/progress_page.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/job_node.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// "[rank0]: RESULT key=value" lines -> {key: value}.
std::map<std::string, std::string> results(const std::string& out) {
  std::map<std::string, std::string> r;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    const auto pos = line.find("RESULT ");
    if (pos == std::string::npos) continue;
    std::istringstream fields(line.substr(pos + 7));
    std::string kv;
    while (fields >> kv) {
      const auto eq = kv.find('=');
      if (eq != std::string::npos) r[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  return r;
}

Finished run_under_ddprun(int nproc, std::vector<std::string> args, std::vector<std::string> extra_flags = {},
                          std::map<std::string, std::string> env = {}) {
  std::vector<std::string> argv{DDPRUN_BIN, "--nproc_per_node", std::to_string(nproc)};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  argv.push_back(SDK_TEST_WORKER_BIN);
  argv.insert(argv.end(), args.begin(), args.end());
  env.emplace("OMP_NUM_THREADS", "1");
  Subprocess p(argv, env);
  return p.wait(300s);
}

// World size x gradient reducer: the direct Gloo reducer with a 64-byte message limit (every
// bucket split into many messages, as large buckets are), and the process group's all-reduce.
class DdpEquivalenceTest : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(DdpEquivalenceTest, ParametersEqualSingleProcessTrainingOnTheWholeBatch) {
  const auto [world, reducer] = GetParam();
  const Finished f =
      run_under_ddprun(world, {"ddp-equivalence", "4", reducer}, {}, {{"DDPRUN_DDP_MAX_MESSAGE_BYTES", "64"}});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  auto r = results(f.out);
  EXPECT_EQ(r["world_size"], std::to_string(world));
  EXPECT_EQ(r["direct_gloo"], reducer == "direct" && DDPRUN_DIRECT_GLOO_BUILT ? "1" : "0");
  EXPECT_GE(std::stoi(r["buckets"]), 3) << "the test model should span several buckets";
  EXPECT_EQ(std::stod(r["init_diff_between_ranks"]), 0.0) << "rank 0's parameters were not broadcast";
  EXPECT_LE(std::stod(r["max_abs_diff_vs_single"]), 1e-5);
  EXPECT_EQ(std::stod(r["max_abs_diff_between_ranks"]), 0.0);
  EXPECT_EQ(std::stod(r["buffer_diff_between_ranks"]), 0.0) << "buffers not synced from rank 0";
}

INSTANTIATE_TEST_SUITE_P(TwoAndThreeProcesses, DdpEquivalenceTest,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values("direct", "process-group")),
                         [](const auto& test) {
                           return std::to_string(std::get<0>(test.param)) + "_" +
                                  (std::get<1>(test.param) == "direct" ? "direct_gloo" : "process_group");
                         });

TEST(DdpTest, PeerThatLeavesGivesTheOthersAClearErrorNotAHang) {
  const Finished f = run_under_ddprun(2, {"peer-exits"});
  ASSERT_FALSE(f.timed_out);
  EXPECT_NE(f.exit_code, 0) << f.out << f.err;
  auto r = results(f.out);
  EXPECT_EQ(r["failed_step"], "2") << f.out << f.err;
  const std::string expected = DDPRUN_DIRECT_GLOO_BUILT ? "gradient all-reduce (Gloo) failed" : "Connection closed";
  EXPECT_NE((f.out + f.err).find(expected), std::string::npos) << f.out << f.err;
}

TEST(DdpTest, NoSyncAccumulatesLocallyThenReducesBothMicroBatches) {
  const Finished f = run_under_ddprun(2, {"no-sync"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  auto r = results(f.out);
  EXPECT_EQ(r["local_grads_differed"], "1");
  EXPECT_LE(std::stod(r["max_abs_diff_vs_single"]), 1e-5);
}

// As Python DDP: without find_unused_parameters, the forward after a step that left parameters
// without a gradient fails, and (unlike Python without TORCH_DISTRIBUTED_DEBUG) names them; with
// it, a parameter no rank used keeps an undefined gradient.
TEST(DdpTest, UnusedParameterIsReportedByNameOrLeftUntouched) {
  const Finished report = run_under_ddprun(2, {"unused-parameter", "report"});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  EXPECT_NE(report.out.find("Expected to have finished reduction in the prior iteration"), std::string::npos)
      << report.out;
  EXPECT_NE(report.out.find("unused.weight"), std::string::npos) << report.out;
  EXPECT_NE(report.out.find("unused.bias"), std::string::npos) << report.out;
  const Finished find = run_under_ddprun(2, {"unused-parameter", "find"});
  ASSERT_EQ(find.exit_code, 0) << find.err;
  auto r = results(find.out);
  EXPECT_EQ(r["unused_grad_defined"], "0");
  // d(sum(W x + b))/dW[0][0] = sum of x[:, 0] = 2 * (rank + 1): 2 and 4, averaged to 3.
  EXPECT_DOUBLE_EQ(std::stod(r["used_grad"]), 3.0);
}

// A user's hook with its own state: called once per bucket with the bucket's index, on the local
// sums (not divided: a hook that only sums gives world x DDP's average), named in the logging
// data; a second hook is refused, as in Python.
TEST(DdpTest, ACommunicationHookReceivesEveryBucketUndivided) {
  for (int world : {2, 3}) {
    const Finished f = run_under_ddprun(world, {"custom-hook"});
    ASSERT_EQ(f.exit_code, 0) << f.err;
    auto r = results(f.out);
    ASSERT_GE(std::stoi(r["buckets"]), 3) << f.out;
    EXPECT_EQ(std::stoi(r["hook_calls"]), 1 + std::stoi(r["buckets"])) << f.out;
    EXPECT_EQ(r["indices_ok"], "1") << f.out;
    EXPECT_EQ(r["last_buckets"], "2") << f.out;
    EXPECT_EQ(r["comm_hook"], "sum_hook");
    EXPECT_LE(std::stod(r["sum_vs_world_times_mean"]), 1e-6) << f.out;
    EXPECT_EQ(r["second_hook_error"], "1") << f.out;
  }
}

// PowerSGD, layer by layer and batched: after its vanilla iterations it compresses (the
// compression statistics say how much); at full rank its low-rank factors rebuild DDP's average,
// at rank 1 they do not; error feedback or warm start with start_powerSGD_iter 1 is refused.
TEST(DdpTest, PowerSgdAtFullRankIsTheAverageAndAtRankOneIsNot) {
  for (int world : {2, 3}) {
    const Finished f = run_under_ddprun(world, {"powersgd"});
    ASSERT_EQ(f.exit_code, 0) << f.err;
    auto r = results(f.out);
    for (const std::string run : {"layerwise_full", "batched_full", "layerwise_rank1", "batched_rank1"}) {
      EXPECT_EQ(r[run + "_iter"], "4") << run;
      EXPECT_GT(std::stod(r[run + "_rate"]), 0.0) << run;
    }
    EXPECT_EQ(r["layerwise_full_hook"], "powerSGD_hook");
    EXPECT_EQ(r["batched_full_hook"], "batched_powerSGD_hook");
    EXPECT_LE(std::stod(r["layerwise_full_rel"]), 1e-4) << f.out;
    EXPECT_LE(std::stod(r["batched_full_rel"]), 1e-4) << f.out;
    EXPECT_GT(std::stod(r["layerwise_rank1_rel"]), 1e-2) << f.out;
    EXPECT_GT(std::stod(r["batched_rank1_rel"]), 1e-2) << f.out;
    EXPECT_GT(std::stod(r["layerwise_rank1_rate"]), 1.5) << f.out;
    EXPECT_EQ(r["start_iter_1_refused"], "1") << f.out;
  }
}

// SyncBatchNorm over 2 and 3 ranks with uneven batches (one rank empty at 3) is BatchNorm over
// the concatenated batch: outputs, input gradients, summed parameter gradients, running
// statistics, evaluation; alone on a rank it is not.
TEST(DdpTest, SyncBatchNormIsBatchNormOverEveryRanksBatch) {
  for (int world : {2, 3}) {
    const Finished f = run_under_ddprun(world, {"sync-batch-norm"});
    ASSERT_EQ(f.exit_code, 0) << f.err;
    auto r = results(f.out);
    EXPECT_LE(std::stod(r["sync_vs_whole_batch"]), 1e-5) << f.out;
    EXPECT_GT(std::stod(r["alone_vs_sync"]), 1e-2) << f.out;
    EXPECT_EQ(r["tiny_batch_ok"], "1") << f.out;
  }
}

// Quantization-aware training with SyncBatchNorm in a fused Conv+BN+ReLU: 2 ranks' shares give the
// output and BatchNorm statistics of the plain module over the whole batch, frozen statistics stay.
TEST(DdpTest, QatConvBnWithSyncBatchNormIsTheWholeBatchsConvBn) {
  const Finished f = run_under_ddprun(2, {"qat-sync-bn"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  auto r = results(f.out);
  EXPECT_LE(std::stod(r["qat_sync_bn_vs_whole_batch"]), 1e-4) << f.out;
  EXPECT_EQ(r["qat_sync_bn_batches"], "2") << f.out;
}

// DistributedDataParallel is a module, as Python's DDP is: another module's child whose training
// still reduces the gradients, its parameters and eval() those of the module it wraps, its state
// dict the module's under "module.", torch::save of one DDP loads into another.
TEST(DdpTest, DdpIsAModuleThatNestsSavesAndLoads) {
  TempDir dir;
  const Finished f = run_under_ddprun(2, {"ddp-module", dir.path.string()});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  auto r = results(f.out);
  EXPECT_EQ(r["ddp_module_name_mismatches"], "0") << f.out;
  EXPECT_EQ(r["ddp_module_same_parameters"], "1") << f.out;
  EXPECT_EQ(std::stod(r["ddp_module_diff_between_ranks"]), 0.0) << f.out;
  EXPECT_EQ(r["ddp_module_eval_reaches_module"], "1") << f.out;
  EXPECT_EQ(std::stod(r["ddp_module_loaded_diff"]), 0.0) << f.out;
  EXPECT_EQ(r["ddp_module_printed_as_ddp"], "1") << f.out;
}

// A trained QAT model's clone(), as LibTorch's modules clone: every module of its own type with
// the same state to the bit (per-channel observers, frozen BatchNorm), the same outputs, weights of
// its own, no random numbers drawn; a converted model's clone runs the same int8 forward.
TEST(DdpTest, QatModelsCloneAsLibTorchModulesDo) {
  const Finished f = run_under_ddprun(1, {"qat-clone"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  auto r = results(f.out);
  EXPECT_EQ(r["qat_clone_types"], "4") << f.out;
  EXPECT_EQ(r["qat_clone_state_diffs"], "0") << f.out;
  EXPECT_EQ(std::stod(r["qat_clone_train_diff"]), 0.0) << f.out;
  EXPECT_EQ(std::stod(r["qat_clone_eval_diff"]), 0.0) << f.out;
  EXPECT_EQ(r["qat_clone_rng_untouched"], "1") << f.out;
  EXPECT_EQ(r["qat_clone_diffs_after_write"], "1") << f.out;
  EXPECT_EQ(std::stod(r["qat_clone_int8_diff"]), 0.0) << f.out;
  EXPECT_EQ(r["qat_clone_int8_converted"], "1") << f.out;
}

// ZeroRedundancyOptimizer with SGD and Adam gives the parameters of DDP with a local optimizer,
// bit for bit, holding about 1/N of the optimizer state per rank; its checkpoint, made at 4 ranks,
// resumes at 2 where one process over the whole batch would be (a fresh Adam state would not be);
// a checkpoint of another model is refused.
TEST(DdpTest, ZeroShardsTheOptimizerStateAndItsCheckpointMovesFrom4RanksTo2) {
  TempDir dir;
  const Finished train = run_under_ddprun(4, {"zero", "train", dir.path.string()});
  ASSERT_EQ(train.exit_code, 0) << train.err;
  auto r = results(train.out);
  EXPECT_EQ(std::stod(r["zero_vs_local_optimizer"]), 0.0) << train.out;
  EXPECT_LE(std::stod(r["state_share"]), 0.25 + 0.05) << train.out;
  EXPECT_GE(std::stoi(r["params_owned_min"]), 1) << train.out;
  const Finished resume = run_under_ddprun(2, {"zero", "resume", dir.path.string()});
  ASSERT_EQ(resume.exit_code, 0) << resume.err;
  auto s = results(resume.out);
  EXPECT_LE(std::stod(s["resumed_vs_expected"]), 1e-5) << resume.out;
  EXPECT_GT(std::stod(s["resumed_vs_reset"]), 1e-3) << resume.out;
  EXPECT_EQ(s["wrong_model_refused"], "1") << resume.out;
}

TEST(CheckpointTest, RoundTripWithAndWithoutModulePrefix) {
  TempDir dir;
  const Finished f = run_under_ddprun(2, {"checkpoint", dir.path.string()});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  auto r = results(f.out);
  EXPECT_EQ(r["loaded_epoch"], "5");
  EXPECT_EQ(std::stod(r["roundtrip_diff"]), 0.0);
  EXPECT_EQ(std::stod(r["prefixed_load_diff"]), 0.0);
  EXPECT_EQ(r["missing_file"], "0");
  EXPECT_FALSE(fs::exists(dir.path / "ckpt.pt.tmp"));
}

TEST(CheckpointTest, JobKilledMidRunResumesFromLatestCheckpointAfterRestart) {
  TempDir dir;
  const Finished f = run_under_ddprun(2, {"resume", dir.path.string(), "5", "2"}, {"--max_restarts", "1"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(f.out.find("RESULT attempt=0 start_epoch=0"), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("RESULT attempt=1 start_epoch=3"), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("RESULT finished_epochs=5"), std::string::npos);
  EXPECT_NE(f.err.find("simulated crash after epoch 2"), std::string::npos);
}

// Two jobs saving to the same checkpoint path at once: every save succeeds and every load after
// one finds a whole checkpoint (a fixed ".tmp" name made one job's rename take the other's file).
TEST(CheckpointTest, TwoJobsSavingToOnePathNeverCollide) {
  TempDir dir;
  const std::string path = (dir.path / "shared.pt").string();
  const std::map<std::string, std::string> alone{
      {"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_ADDR", ""}, {"MASTER_PORT", ""}, {"OMP_NUM_THREADS", "1"}};
  Subprocess a({SDK_TEST_WORKER_BIN, "checkpoint-race", path, "0", "300"}, alone);
  Subprocess b({SDK_TEST_WORKER_BIN, "checkpoint-race", path, "1000", "300"}, alone);
  const Finished fa = a.wait(120s), fb = b.wait(120s);
  ASSERT_EQ(fa.exit_code, 0) << fa.err;
  ASSERT_EQ(fb.exit_code, 0) << fb.err;
  EXPECT_EQ(results(fa.out)["race_loads"], "300");
  EXPECT_EQ(results(fb.out)["race_loads"], "300");
  for (const auto& e : fs::directory_iterator(dir.path)) EXPECT_EQ(e.path().filename(), "shared.pt");
}

TEST(CheckpointTest, AFailedSaveKeepsThePreviousCheckpointAndSaysWhy) {
  TempDir dir;
  Subprocess p({SDK_TEST_WORKER_BIN, "checkpoint-full", dir.str()},
               {{"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_ADDR", ""}, {"MASTER_PORT", ""}});
  const Finished f = p.wait(120s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  auto r = results(f.out);
  EXPECT_EQ(r["loaded_epoch"], "7") << "the previous checkpoint must be intact";
  EXPECT_EQ(r["leftovers"], "0") << "no temporary file may be left behind";
  EXPECT_NE(f.out.find("RESULT_ERROR cannot write checkpoint " + dir.str() + "/ckpt.pt: writing "), std::string::npos)
      << f.out;
  EXPECT_NE(f.out.find("File too large"), std::string::npos) << f.out;
}

// A progress page as ddprun makes it, with this node's place in the job confirmed until
// `membership_until_ns` (CLOCK_MONOTONIC).
std::string progress_page(const TempDir& dir, uint64_t membership_until_ns) {
  const std::string file = (dir.path / "progress").string();
  std::string bytes(ddprun::worker::ProgressPage::kFileSize, '\0');
  const uint64_t magic = ddprun::worker::ProgressPage::kMagic;
  std::memcpy(bytes.data(), &magic, sizeof magic);
  std::memcpy(bytes.data() + offsetof(ddprun::worker::ProgressPage, membership_until_ns), &membership_until_ns,
              sizeof membership_until_ns);
  std::ofstream(file, std::ios::binary) << bytes;
  return file;
}

// Elastic jobs: a node whose ddprun stopped renewing its place (frozen, stopped, cut off) may have
// been replaced by a group re-formed without it; its rank 0 must not publish over that group's
// checkpoint. A confirmed place publishes as usual.
TEST(CheckpointTest, ANodeWhosePlaceInTheJobLapsedPublishesNothing) {
  TempDir dir, pages;
  const std::string path = (dir.path / "ckpt.pt").string();
  const std::map<std::string, std::string> alone{
      {"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_ADDR", ""}, {"MASTER_PORT", ""}};
  auto with_page = [&](uint64_t until) {
    auto env = alone;
    env["DDPRUN_PROGRESS_FILE"] = progress_page(pages, until);
    return env;
  };
  Subprocess lapsed({SDK_TEST_WORKER_BIN, "checkpoint-once", path}, with_page(1));
  const Finished fl = lapsed.wait(120s);
  EXPECT_EQ(fl.exit_code, 1) << fl.err;
  EXPECT_NE(fl.err.find("not publishing checkpoint " + path + ": this node's place in the job lapsed"),
            std::string::npos)
      << fl.err;
  EXPECT_TRUE(fs::is_empty(dir.path)) << "neither the checkpoint nor a temporary file";

  Subprocess confirmed({SDK_TEST_WORKER_BIN, "checkpoint-once", path}, with_page(UINT64_MAX / 2));
  const Finished fc = confirmed.wait(120s);
  EXPECT_EQ(fc.exit_code, 0) << fc.err;
  EXPECT_TRUE(fs::exists(path));
}

// The durable-replace order, as the kernel sees it: the temporary file is fsynced before it is
// renamed over the checkpoint, and the directory is fsynced after the rename.
TEST(CheckpointTest, SaveFsyncsTheFileBeforeTheRenameAndTheDirectoryAfter) {
  TempDir dir;
  const std::string trace = (dir.path / "trace").string();
  const std::string path = (dir.path / "ckpt.pt").string();
  Subprocess p({"/usr/bin/strace", "-f", "-o", trace, "-e", "trace=openat,fsync,fdatasync,rename,renameat,renameat2",
                SDK_TEST_WORKER_BIN, "checkpoint-once", path},
               {{"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_ADDR", ""}, {"MASTER_PORT", ""}});
  const Finished f = p.wait(120s);
  ASSERT_NE(f.exit_code, 127) << "strace is missing (scripts/install_deps.sh installs it)";
  ASSERT_EQ(f.exit_code, 0) << f.err;
  std::ifstream in(trace);
  std::string line;
  std::string tmp_fd, dir_fd;
  int line_no = 0, file_synced = -1, renamed = -1, dir_synced = -1;
  while (std::getline(in, line)) {
    ++line_no;
    const auto ret = line.rfind("= ");
    if (line.find("openat(") != std::string::npos && line.find("ckpt.pt.tmp.") != std::string::npos &&
        ret != std::string::npos) {
      tmp_fd = line.substr(ret + 2);
    } else if (line.find("openat(") != std::string::npos && line.find("O_DIRECTORY") != std::string::npos &&
               line.find("\"" + dir.str() + "\"") != std::string::npos && ret != std::string::npos) {
      dir_fd = line.substr(ret + 2);
    } else if (line.find("rename") != std::string::npos && line.find("ckpt.pt.tmp.") != std::string::npos) {
      renamed = line_no;
    } else if (!tmp_fd.empty() && line.find("fsync(" + tmp_fd + ")") != std::string::npos && renamed < 0) {
      file_synced = line_no;
    } else if (!dir_fd.empty() && line.find("fsync(" + dir_fd + ")") != std::string::npos) {
      dir_synced = line_no;
    }
  }
  EXPECT_GT(file_synced, 0) << "the temporary file is never fsynced";
  EXPECT_GT(renamed, file_synced) << "renamed before its data was on disk";
  EXPECT_GT(dir_synced, renamed) << "the directory is not fsynced after the rename";
}

// --- progress signals: ddprun's hang watchdog and step rates --------------------------------------

TEST(WorkerSdkProgressTest, AWorkerThatStopsSteppingIsCaughtWhileTheOthersWaitInTheAllReduce) {
  // Rank 1 stops after 20 steps; rank 0 waits in the direct Gloo reducer's all-reduce, inside the
  // SDK's CollectiveWait, so its CPU time (spinning or not) is not taken for progress.
  TempDir logs;  // (a hung run's directory is kept for its stacks: here, not under /tmp)
  const Finished f =
      run_under_ddprun(2, {"train", "20", "1", "-1", "0"}, {"--hang_timeout", "5", "--log_dir", logs.str()});
  ASSERT_FALSE(f.timed_out) << f.err;
  EXPECT_EQ(f.exit_code, 124) << f.err;
  EXPECT_NE(f.err.find("behind     : rank 1\n"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("rank 0 waits for other ranks (in a collective or the store); rank 1 does not"),
            std::string::npos)
      << f.err;
  EXPECT_NE(f.err.find(", step 20, no progress for"), std::string::npos) << f.err;
}

nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str(), nullptr, /*allow_exceptions=*/false);
}

TEST(WorkerSdkProgressTest, StepRatesAreReportedAndAStragglerIsNamed) {
  // Rank 1 computes 25 ms longer per step; rates are checked every second here (10 s by default).
  TempDir dir;
  const auto report_file = dir.path / "report.json";
  const Finished f = run_under_ddprun(2, {"train", "250", "-1", "1", "25"},
                                      {"--straggler_factor", "1.5", "--report_file", report_file.string()},
                                      {{"DDPRUN_STEP_RATES_PERIOD", "1"}});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(f.err.find("rank 1 is a straggler: "), std::string::npos) << f.err;
  EXPECT_EQ(f.err.find("rank 0 is a straggler"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("per-rank step rates (whole run):"), std::string::npos) << f.err;
  // The figures, from the report file.
  const auto report = read_json(report_file);
  ASSERT_TRUE(report.is_object()) << f.err;
  const auto& rates = report["step_rates"];
  ASSERT_TRUE(rates.is_object()) << report.dump(2);
  EXPECT_EQ(rates["scope"], "job");
  ASSERT_EQ(rates["ranks"].size(), 2u) << rates.dump(2);
  for (int rank = 0; rank < 2; ++rank) {
    const auto& r = rates["ranks"][rank];
    EXPECT_EQ(r["rank"], rank);
    EXPECT_EQ(r["steps"], 250);
    EXPECT_GT(r.value("steps_per_s", 0.0), 0.0) << r.dump();
    EXPECT_GT(r.value("compute_ms_per_step", 0.0), 0.0) << r.dump();  // the SDK reports its waits
    EXPECT_EQ(r["straggler"], rank == 1) << r.dump();
  }
}

TEST(WorkerSdkProgressTest, NodeZeroReportsTheWholeJobsRatesFromEveryNode) {
  const int port = free_port();
  TempDir dir;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(JobNode(n)
                        .meet(at_master(port))
                        .conf("")
                        .flags({"--report_file", (dir.path / ("node" + std::to_string(n) + ".json")).string()})
                        .env({{"OMP_NUM_THREADS", "1"}, {"DDPRUN_STEP_RATES_PERIOD", "1"}})
                        .start({SDK_TEST_WORKER_BIN, "train", "300", "-1", "-1", "0"}));
  }
  const Finished f0 = nodes[0]->wait(300s), f1 = nodes[1]->wait(300s);
  ASSERT_EQ(f0.exit_code, 0) << f0.err;
  ASSERT_EQ(f1.exit_code, 0) << f1.err;
  EXPECT_EQ(f1.err.find("per-rank step rates"), std::string::npos) << "one table, on node 0";
  const auto table = f0.err.find("per-rank step rates (whole run):");
  ASSERT_NE(table, std::string::npos) << f0.err;
  // rank 0 on node 0 and rank 1 on node 1, each with its 300 steps.
  EXPECT_NE(f0.err.find("     0     0        300"), std::string::npos) << f0.err.substr(table);
  EXPECT_NE(f0.err.find("     1     1        300"), std::string::npos) << f0.err.substr(table);
  // Node 0's report has the job's ranks, node 1's its own.
  for (int n = 0; n < 2; ++n) {
    const auto report = read_json(dir.path / ("node" + std::to_string(n) + ".json"));
    ASSERT_TRUE(report.is_object()) << "node " << n;
    const auto& rates = report["step_rates"];
    ASSERT_TRUE(rates.is_object()) << report.dump(2);
    EXPECT_EQ(rates["scope"], n == 0 ? "job" : "node");
    ASSERT_EQ(rates["ranks"].size(), n == 0 ? 2u : 1u) << rates.dump(2);
    for (const auto& r : rates["ranks"]) {
      EXPECT_EQ(r["steps"], 300) << r.dump();
      EXPECT_EQ(r["node"], r["rank"]) << r.dump();  // one rank per node
    }
  }
}

TEST(WorkerSdkTest, RunsAloneWithoutALauncher) {
  Subprocess p({SDK_TEST_WORKER_BIN, "ddp-equivalence", "2"},
               {{"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_ADDR", ""}, {"MASTER_PORT", ""}});
  const Finished f = p.wait(120s);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  auto r = results(f.out);
  EXPECT_EQ(r["world_size"], "1");
  EXPECT_LE(std::stod(r["max_abs_diff_vs_single"]), 1e-6);
}

}  // namespace
}  // namespace ddprun::test
