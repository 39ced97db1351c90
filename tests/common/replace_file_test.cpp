// Replacing a file, one way (common/replace_file.hpp): the new bytes whole or the old file as it
// was, never a part, and no temporary file left behind whatever fails.
#include "common/replace_file.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "tests/support/files.hpp"
#include "tests/support/small_disk.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun {
namespace {

namespace fs = std::filesystem;

size_t files_in(const fs::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(ReplaceFileTest, ReplacesWholeWithTheModeAskedAndLeavesNothingElse) {
  test::TempDir dir;
  const std::string path = (dir.path / "state").string();
  EXPECT_FALSE(replace_file(path, "one\n"));
  EXPECT_FALSE(replace_file(path, "two\n", {Durability::Atomic, 0644, false, {}}));
  EXPECT_EQ(test::read_file(path), "two\n");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_FALSE(replace_file(path, "three\n"));
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the default is private";
  EXPECT_EQ(files_in(dir.path), 1u);
}

TEST(ReplaceFileTest, AMissingDirectoryIsMadeOnlyWhenAsked) {
  test::TempDir dir;
  const std::string path = (dir.path / "a" / "b" / "report.json").string();
  const auto failed = replace_file(path, "{}");
  ASSERT_TRUE(failed);
  EXPECT_NE(failed->what().find("creating a temporary file in " + (dir.path / "a" / "b").string()), std::string::npos)
      << failed->what();
  ReplaceFile how;
  how.create_directory = true;
  EXPECT_FALSE(replace_file(path, "{}", how));
  EXPECT_EQ(test::read_file(path), "{}");
}

TEST(ReplaceFileTest, AFullDiskKeepsTheOldFileWhole) {
  test::SmallDisk disk("64k");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a small tmpfs here: " << disk.error;
  const std::string path = (disk.dir.path / "checkpoint").string();
  ASSERT_FALSE(replace_file(path, std::string(8 * 1024, 'a')));
  const auto failed = replace_file(path, std::string(256 * 1024, 'b'));
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->err, ENOSPC) << failed->what();
  EXPECT_NE(failed->what().find("writing "), std::string::npos) << failed->what();
  EXPECT_EQ(test::read_file(path), std::string(8 * 1024, 'a'));
  EXPECT_EQ(files_in(disk.dir.path), 1u) << "the temporary file is removed";
}

TEST(ReplaceFileTest, AReasonNotToPublishKeepsTheOldFile) {
  test::TempDir dir;
  const std::string path = (dir.path / "ckpt.pt").string();
  ASSERT_FALSE(replace_file(path, "epoch 1"));
  ReplaceFile how;
  how.before_publish = [] { return std::optional<std::string>("this node's place in the job lapsed"); };
  const auto failed = replace_file(path, "epoch 2", how);
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->err, 0);
  EXPECT_EQ(failed->what(), "this node's place in the job lapsed");
  EXPECT_EQ(test::read_file(path), "epoch 1");
  EXPECT_EQ(files_in(dir.path), 1u);
}

}  // namespace
}  // namespace ddprun
