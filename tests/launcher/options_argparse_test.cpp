// What ddprun's parser reads as torchrun's does (argparse and torchrun's own value parsers), from
// PyTorch's launcher tests: abbreviated flags, a quoted --rdzv_conf, the --redirects pattern.
#include <gtest/gtest.h>

#include <string>

#include "launcher/cli/flags.hpp"
#include "launcher/cli/options.hpp"
#include "tests/launcher/options_test_support.hpp"

namespace ddprun::launcher {
namespace {

using test_options::error_of;
using test_options::parse;

// argparse takes a unique prefix of a flag for it, in either spelling, with its value inline or after.
TEST(OptionsArgparseTest, AUniquePrefixOfAFlagStandsForIt) {
  const auto o = parse({"--nproc-per", "3", "--redirect=1", "--max_rest", "2", "--standa", "train"});
  EXPECT_EQ(o.nproc_per_node, 3);
  EXPECT_EQ(o.redirects.all, 1);
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_TRUE(o.standalone);
  EXPECT_TRUE(parse({"--he"}).help);
  EXPECT_TRUE(parse({"--vers"}).version);
  // A flag given in full is never taken for a longer one (--role, not --role_something).
  EXPECT_EQ(parse({"--role", "trainer", "t"}).role, "trainer");
  // A bad value is said with the flag's full name.
  EXPECT_EQ(error_of({"--max_rest", "x", "t"}).rfind("--max_restarts: expected", 0), 0u)
      << error_of({"--max_rest", "x", "t"});
}

// A prefix of several flags is refused with the candidates, as argparse refuses it; a flag's
// other spelling is the same flag (--run for --run_id alone would be --rdzv_id, but --run_path too).
TEST(OptionsArgparseTest, APrefixOfSeveralFlagsIsRefusedNamingThem) {
  const std::string max = error_of({"--max", "1", "t"});
  EXPECT_NE(max.find("ambiguous option '--max'"), std::string::npos) << max;
  for (const char* f : {"--max_restarts", "--max_unfit_leaves", "--max_no_progress_restarts"}) {
    EXPECT_NE(max.find(f), std::string::npos) << max;
  }
  const std::string run = error_of({"--run", "x", "t"});
  EXPECT_NE(run.find("--rdzv_id"), std::string::npos) << run;
  EXPECT_NE(run.find("--run_path"), std::string::npos) << run;
  EXPECT_NE(error_of({"--h", "t"}).find("--help"), std::string::npos);  // --help and --hang_timeout
  EXPECT_EQ(error_of({"--nosuch", "t"}), "unknown option '--nosuch' (see ddprun --help for the list)");
}

// The program's arguments are its own: a prefix of a ddprun flag after the program is not ddprun's.
TEST(OptionsArgparseTest, ArgumentsAfterTheProgramAreNeverTakenForAbbreviations) {
  const auto o = parse({"--nproc", "2", "train.py", "--max", "--nproc", "5"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--max", "--nproc", "5"}));
}

// PyTorch's test_launch_elastic passes --rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'
// from Python, quotes included: the keys inside the quotes are read.
TEST(OptionsArgparseTest, QuotesAroundTheWholeRdzvConfAreDropped) {
  const auto o = parse({"--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'", "t"});
  EXPECT_EQ(o.rdzv_timeouts.join_timeout, std::chrono::seconds(5));
  EXPECT_EQ(o.rdzv_timeouts.last_call_timeout, std::chrono::seconds(1));
  EXPECT_TRUE(o.ignored_rdzv_conf.empty());
  EXPECT_EQ(parse({"--rdzv_conf", "\"last_call_timeout=2\"", "t"}).rdzv_timeouts.last_call_timeout,
            std::chrono::seconds(2));
  EXPECT_EQ(parse({"t"}, {{"PET_RDZV_CONF", "'last_call_timeout=3'"}}).rdzv_timeouts.last_call_timeout,
            std::chrono::seconds(3));
  // A quote that is not around the whole list is part of a key or a value, as before.
  EXPECT_NE(error_of({"--rdzv_conf", "'join_timeout=5", "t"}).find("did you mean 'join_timeout'"), std::string::npos);
}

// torchrun's pattern for a per-rank --redirects or --tee is (N:S,)*N:S: a trailing comma is refused.
TEST(OptionsArgparseTest, APerRankStreamListWithATrailingCommaIsRefused) {
  EXPECT_EQ(error_of({"--redirects", "0:1,", "t"}),
            "--redirects: expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) or per local rank like '0:1,1:3', got "
            "'0:1,'");
  EXPECT_NE(error_of({"--tee", "0:1,1:2,", "t"}).find("--tee: expected"), std::string::npos);
  EXPECT_EQ(parse({"--tee", "0:1,1:2", "t"}).tee.for_rank(1), 2);
}

}  // namespace
}  // namespace ddprun::launcher
