// Every example runs for a few steps under ddprun (2 workers) on a small slice of the data: the loss
// falls, rank 0 alone prints results, and the final JSON line parses.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/subprocess.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

struct ExampleCase {
  std::string name;
  std::vector<std::string> args;
};

std::ostream& operator<<(std::ostream& out, const ExampleCase& c) { return out << c.name; }

Finished run_example(const std::string& name, std::vector<std::string> args) {
  std::vector<std::string> argv{DDPRUN_BIN, "--nproc_per_node", "2", std::string(EXAMPLES_DIR) + "/" + name};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess p(argv, {{"OMP_NUM_THREADS", "1"}});
  return p.wait(600s);
}

nlohmann::json final_json(const std::string& out) {
  std::istringstream lines(out);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (line.find("{\"example\"") != std::string::npos) last = line.substr(line.find('{'));
  }
  return last.empty() ? nlohmann::json() : nlohmann::json::parse(last);
}

class ExampleTest : public ::testing::TestWithParam<ExampleCase> {};

TEST_P(ExampleTest, LossFallsAndOnlyRankZeroPrints) {
  const auto& c = GetParam();
  const Finished f = run_example(c.name, c.args);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const auto j = final_json(f.out);
  ASSERT_FALSE(j.is_null()) << f.out;
  EXPECT_EQ(j["example"], c.name);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_LT(j["final_loss"].get<double>(), j["first_loss"].get<double>()) << f.out;
  EXPECT_GT(j["samples_per_s"].get<double>(), 0.0);
  EXPECT_NE(f.out.find("[rank0]: epoch 1/"), std::string::npos) << f.out;
  EXPECT_EQ(f.out.find("[rank1]:"), std::string::npos) << "rank 1 printed:\n" << f.out;
  // Not a terminal (ddprun's console): the epoch's progress as plain lines, never redrawn in place.
  EXPECT_NE(f.out.find("[rank0]: progress: epoch 1/"), std::string::npos) << f.out;
  EXPECT_EQ(f.out.find('\r'), std::string::npos) << f.out;
}

INSTANTIATE_TEST_SUITE_P(
    AllExamples, ExampleTest,
    ::testing::Values(ExampleCase{"fashion_mnist_lenet",
                                  {"--epochs", "2", "--train-limit", "2000", "--test-limit", "500"}},
                      ExampleCase{"mlp", {"--epochs", "2", "--train-limit", "2000", "--test-limit", "500"}},
                      ExampleCase{"toy_cnn", {"--epochs", "3", "--train-limit", "512", "--test-limit", "128"}},
                      ExampleCase{"lstm_classifier", {"--epochs", "3", "--train-limit", "1024", "--test-limit", "256"}},
                      ExampleCase{"resnet18",
                                  {"--epochs", "2", "--batch-size", "8", "--max-steps", "3", "--train-limit", "48",
                                   "--test-limit", "32"}}),
    [](const auto& test) { return test.param.name; });

// On a terminal (util-linux's script(1) gives the example one), rank 0's progress is a bar redrawn
// in place and erased before the epoch's line; --no-progress shows none.
TEST(ExampleProgressTest, OnATerminalTheEpochIsABarRedrawnInPlace) {
  const std::string example = std::string(EXAMPLES_DIR) + "/mlp --epochs 1 --train-limit 3000 --test-limit 100";
  const Finished bar =
      Subprocess({"/usr/bin/script", "-qec", example, "/dev/null"}, {{"OMP_NUM_THREADS", "1"}}).wait(300s);
  ASSERT_EQ(bar.exit_code, 0) << bar.out << bar.err;
  EXPECT_NE(bar.out.find("\rprogress: epoch 1/1 ["), std::string::npos) << bar.out;
  EXPECT_NE(bar.out.find("\r\x1b[Kepoch 1/1: loss"), std::string::npos) << bar.out;
  EXPECT_EQ(bar.out.find("progress: epoch 1/1 25%"), std::string::npos) << "plain lines on a terminal:\n" << bar.out;
  const Finished quiet =
      Subprocess({"/usr/bin/script", "-qec", example + " --no-progress", "/dev/null"}, {{"OMP_NUM_THREADS", "1"}})
          .wait(300s);
  ASSERT_EQ(quiet.exit_code, 0) << quiet.out;
  EXPECT_EQ(quiet.out.find("progress:"), std::string::npos) << quiet.out;
  EXPECT_NE(quiet.out.find("epoch 1/1: loss"), std::string::npos) << quiet.out;
}

// --comm-hook: the LeNet example trains through each compression hook, and says which it ran.
TEST(ExampleCommHookTest, LeNetTrainsThroughTheCompressionHooks) {
  for (const std::string hook : {"fp16", "bf16", "powersgd:2"}) {
    const Finished f = run_example(
        "fashion_mnist_lenet", {"--epochs", "2", "--train-limit", "2000", "--test-limit", "500", "--comm-hook", hook});
    ASSERT_EQ(f.exit_code, 0) << f.err;
    const auto j = final_json(f.out);
    ASSERT_FALSE(j.is_null()) << f.out;
    EXPECT_EQ(j["comm_hook"], hook);
    EXPECT_LT(j["final_loss"].get<double>(), j["first_loss"].get<double>()) << f.out;
  }
  const Finished bad = run_example("fashion_mnist_lenet", {"--comm-hook", "fp8"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--comm-hook: expected allreduce, fp16, bf16 or powersgd:RANK, got 'fp8'"), std::string::npos)
      << bad.err;
  const Finished bad_rank = run_example("fashion_mnist_lenet", {"--comm-hook", "powersgd:0"});
  EXPECT_EQ(bad_rank.exit_code, 2);
  EXPECT_NE(bad_rank.err.find("powersgd:RANK takes a rank from 1 to 64, got 'powersgd:0'"), std::string::npos)
      << bad_rank.err;
}

// --sync-bn: ResNet-18's batch norms share their statistics over the ranks; a model without
// batch norm says so and exits 2.
TEST(ExampleSyncBnTest, ResNetTrainsWithSyncBatchNormAndLeNetRefusesIt) {
  const Finished f = run_example("resnet18", {"--sync-bn", "--epochs", "1", "--batch-size", "8", "--max-steps", "3",
                                              "--train-limit", "48", "--test-limit", "32"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const auto j = final_json(f.out);
  ASSERT_FALSE(j.is_null()) << f.out;
  EXPECT_EQ(j["sync_bn"], true);
  const Finished lenet = run_example("fashion_mnist_lenet", {"--sync-bn", "--max-steps", "1"});
  EXPECT_EQ(lenet.exit_code, 2);
  EXPECT_NE(lenet.err.find("--sync-bn: this model has no batch norm"), std::string::npos) << lenet.err;
}

TEST(ExampleCheckpointTest, ResumesFromTheCheckpointOfAnEarlierRun) {
  char tmpl[] = "/tmp/ddprun_examples_XXXXXX";
  const fs::path dir = ::mkdtemp(tmpl);
  const std::vector<std::string> common{"--train-limit", "256", "--test-limit", "64", "--checkpoint-dir", dir.string()};
  auto args = common;
  args.insert(args.end(), {"--epochs", "1"});
  Finished first = run_example("toy_cnn", args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_TRUE(fs::exists(dir / "checkpoint.pt"));
  args = common;
  args.insert(args.end(), {"--epochs", "2", "--resume"});
  Finished second = run_example("toy_cnn", args);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.out.find("resumed from " + (dir / "checkpoint.pt").string() + " after epoch 1"), std::string::npos)
      << second.out;
  EXPECT_EQ(second.out.find("epoch 1/2"), std::string::npos) << "epoch 1 should not run again";
  EXPECT_NE(second.out.find("epoch 2/2"), std::string::npos);
  fs::remove_all(dir);
}

// --zero: the optimizer's state sharded over the ranks trains LeNet to the same loss and accuracy,
// to the last printed digit, as the plain optimizer; its consolidated state is checkpointed
// beside the model and a resumed run picks it up.
TEST(ExampleZeroTest, LeNetWithShardedOptimizerStateMatchesThePlainRunAndResumes) {
  char tmpl[] = "/tmp/ddprun_examples_XXXXXX";
  const fs::path dir = ::mkdtemp(tmpl);
  const std::vector<std::string> common{"--train-limit", "512", "--test-limit", "128", "--epochs", "1"};
  const Finished plain = run_example("fashion_mnist_lenet", common);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  auto args = common;
  args.insert(args.end(), {"--zero", "--checkpoint-dir", dir.string()});
  const Finished zero = run_example("fashion_mnist_lenet", args);
  ASSERT_EQ(zero.exit_code, 0) << zero.err;
  const auto p = final_json(plain.out), z = final_json(zero.out);
  ASSERT_FALSE(p.is_null() || z.is_null()) << plain.out << zero.out;
  EXPECT_EQ(z["zero"], true);
  EXPECT_EQ(z["final_loss"], p["final_loss"]);
  EXPECT_EQ(z["test_accuracy"], p["test_accuracy"]);
  // Epoch 1's optimizer state beside epoch 1's checkpoint, named for it.
  EXPECT_TRUE(fs::exists(dir / "checkpoint.pt.zero.0"));
  // A crash while epoch 2 was being saved: its optimizer state written, its checkpoint not (a
  // state of another run stands for it here). A resume must pair epoch 1's model with epoch 1's
  // state, as a resume from the directory without the crash does.
  const fs::path crashed = dir.string() + "-crashed";
  fs::copy(dir, crashed);
  fs::copy_file(dir / "checkpoint.pt.zero.0", crashed / "checkpoint.pt.zero.1");
  {
    std::fstream other(crashed / "checkpoint.pt.zero.1", std::ios::in | std::ios::out | std::ios::binary);
    other.seekp(-64, std::ios::end);
    other << std::string(64, '\x7f');  // not epoch 1's state (and not a readable file either)
  }
  const auto resume = [](const fs::path& from) {
    return run_example("fashion_mnist_lenet", {"--train-limit", "512", "--test-limit", "128", "--epochs", "2", "--zero",
                                               "--resume", "--checkpoint-dir", from.string()});
  };
  const Finished resumed = resume(dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("after epoch 1"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("epoch 2/2"), std::string::npos) << resumed.out;
  EXPECT_TRUE(fs::exists(dir / "checkpoint.pt.zero.1"));
  EXPECT_FALSE(fs::exists(dir / "checkpoint.pt.zero.0")) << "the older state is removed once the newer checkpoint is";
  const Finished after_crash = resume(crashed);
  ASSERT_EQ(after_crash.exit_code, 0) << after_crash.err;
  EXPECT_EQ(final_json(after_crash.out)["final_loss"], final_json(resumed.out)["final_loss"]) << after_crash.out;
  fs::remove_all(dir);
  fs::remove_all(crashed);
}

// FP32 training, QAT fine-tuning with the observer and BatchNorm schedule, int8 conversion: the
// int8 model scores as the fake-quantized one does (a quarter of the float model's bytes), and the
// FP32 baseline comes from the same run.
TEST(ExampleQatTest, QuantizationAwareTrainingEndsInAnInt8ModelAsAccurateAsItsFakeQuantizedOne) {
  const Finished f =
      run_example("fashion_mnist_qat", {"--epochs", "2", "--train-limit", "3000", "--test-limit", "1000"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const auto j = final_json(f.out);
  ASSERT_FALSE(j.is_null()) << f.out;
  EXPECT_EQ(j["epochs"], 7);
  for (const char* k : {"fp32_accuracy", "fake_quant_accuracy", "int8_accuracy"}) {
    EXPECT_GT(j[k].get<double>(), 0.6) << k << "\n" << f.out;
  }
  EXPECT_NEAR(j["int8_accuracy"].get<double>(), j["fake_quant_accuracy"].get<double>(), 0.02) << f.out;
  EXPECT_LT(j["int8_bytes"].get<double>(), 0.3 * j["fp32_bytes"].get<double>());
  EXPECT_FALSE(j["int8_ms_per_batch"].empty());
  EXPECT_NE(f.out.find("observers off"), std::string::npos) << f.out;
  EXPECT_EQ(f.out.find("[rank1]:"), std::string::npos) << "rank 1 printed:\n" << f.out;
}

// --crash-at-step: a drill for ddprun's no-progress stop. The examples report the steps they have
// completed (worker::report_iterations); every attempt crashes at step 5, so three restarts get no
// further and ddprun stops the job (exit 125) with restarts left, saying why.
TEST(ExampleCrashAtStepTest, LeNetThatCrashesAtTheSameStepIsStoppedAfterThreeRestarts) {
  char tmpl[] = "/tmp/ddprun_examples_XXXXXX";
  const fs::path dir = ::mkdtemp(tmpl);
  const std::string report = (dir / "report.json").string();
  Subprocess p({DDPRUN_BIN, "--nproc_per_node", "2", "--max_restarts", "8", "--report_file", report,
                std::string(EXAMPLES_DIR) + "/fashion_mnist_lenet", "--train-limit", "1024", "--test-limit", "64",
                "--epochs", "1", "--crash-at-step", "5", "--no-progress"},
               {{"OMP_NUM_THREADS", "1"}});
  const Finished f = p.wait(600s);
  EXPECT_EQ(f.exit_code, 125) << f.err;
  EXPECT_NE(f.err.find("--crash-at-step 5: rank 0 exits with status 1"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("not restarting: no progress: 3 restart(s) in a row"), std::string::npos) << f.err;
  std::ifstream in(report);
  const auto r = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["restarts"], 3) << r.dump(2);
  EXPECT_EQ(r["not_restarted"], "no_progress");
  EXPECT_EQ(r["root_cause"]["rank"], 0);
  fs::remove_all(dir);
}

TEST(ExampleFlagsTest, BadFlagExitsWithUsage) {
  Subprocess p({std::string(EXAMPLES_DIR) + "/mlp", "--epochs", "zero"});
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 2);
  EXPECT_NE(f.err.find("mlp: --epochs: expected a number"), std::string::npos) << f.err;
}

// --fault-tolerant: only the LeNet example has it, it needs ddprun --replica_group, and it takes
// none of the flags that its own hook and healing replace; each misuse exits 2 and says why.
TEST(ExampleFlagsTest, FaultTolerantMisusesSayWhatIsWrong) {
  const auto alone = [](const std::string& name, std::vector<std::string> args) {
    args.insert(args.begin(), std::string(EXAMPLES_DIR) + "/" + name);
    Subprocess p(args, {{"OMP_NUM_THREADS", "1"}});
    return p.wait(60s);
  };
  const Finished no_group = alone("fashion_mnist_lenet", {"--fault-tolerant", "--train-limit", "100"});
  EXPECT_EQ(no_group.exit_code, 2) << no_group.err;
  EXPECT_NE(
      no_group.err.find("--fault-tolerant trains one replica group of a job: start it with ddprun --replica_group"),
      std::string::npos)
      << no_group.err;
  const Finished mlp = alone("mlp", {"--fault-tolerant"});
  EXPECT_EQ(mlp.exit_code, 2);
  EXPECT_NE(mlp.err.find("--fault-tolerant: mlp has no fault-tolerant mode (fashion_mnist_lenet has one)"),
            std::string::npos)
      << mlp.err;
  const Finished hook = alone("fashion_mnist_lenet", {"--fault-tolerant", "--comm-hook", "fp16"});
  EXPECT_EQ(hook.exit_code, 2);
  EXPECT_NE(hook.err.find("--fault-tolerant takes none of --comm-hook"), std::string::npos) << hook.err;
  const Finished log = alone("fashion_mnist_lenet", {"--commit-log", "commits.log"});
  EXPECT_EQ(log.exit_code, 2);
  EXPECT_NE(log.err.find("--commit-log needs --fault-tolerant"), std::string::npos) << log.err;
}

}  // namespace
}  // namespace ddprun::test
