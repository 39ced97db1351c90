#pragma once
// The flags every example takes. Unknown or malformed flags exit with status 2 and a message.

#include <cstdint>
#include <string>

namespace ddprun::examples {

// --comm-hook powersgd:RANK compresses from this iteration on (plain all-reduce before).
inline constexpr int64_t kPowerSgdStartIter = 10;

struct ExampleFlags {
  int epochs = 3;
  int batch_size = 64;  // per rank: the global batch is batch_size x WORLD_SIZE
  double lr = 0.05;
  std::string checkpoint_dir;                                  // "" = no checkpoints
  std::string data_dir = "/usr/share/datasets/fashion-mnist";  // Fashion-MNIST's four .gz files
  bool resume = false;    // load checkpoint_dir/checkpoint.pt if it exists (also after a restart)
  int64_t max_steps = 0;  // per epoch, 0 = the whole epoch
  // Fault injection: rank 0 exits with status 1 once the run has completed this many steps (counted
  // across restarts: a run resumed from a checkpoint goes on from its count); 0 = never.
  int64_t crash_at_step = 0;
  int64_t train_limit = 0;  // use at most this many training samples (0 = all)
  int64_t test_limit = 0;
  uint64_t seed = 0;
  std::string comm_hook;      // "" = none; allreduce, fp16, bf16 or powersgd:RANK (the SDK's DDP communication hooks)
  int64_t powersgd_rank = 0;  // RANK of powersgd:RANK (0 otherwise)
  bool sync_bn = false;       // batch statistics over every rank (the model's SyncBatchNorm modules)
  bool zero = false;          // the optimizer's state sharded over the ranks (ZeroRedundancyOptimizer)
  // One replica group of a job that trains on through failures (ddprun --replica_group); only the
  // examples that set offers_fault_tolerant in their defaults take --fault-tolerant.
  bool offers_fault_tolerant = false;
  bool fault_tolerant = false;
  std::string commit_log;  // with fault_tolerant: a JSON line per committed step is appended here
  bool progress = true;    // rank 0 shows each epoch's progress (common/progress.hpp); --no-progress
};

// Parses argv over `defaults`; prints usage and exits on --help or a bad flag.
ExampleFlags parse_example_flags(int argc, char** argv, const std::string& name, const std::string& description,
                                 ExampleFlags defaults);

}  // namespace ddprun::examples
