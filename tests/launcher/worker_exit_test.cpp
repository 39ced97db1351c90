// workers::read_error_file and error_message: a worker's error file is read once, without waiting,
// through no link, and only so far; what it says is the torchrun format's message.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "launcher/workers/worker_exit.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::test {
namespace {

namespace fs = std::filesystem;
using launcher::workers::error_message;
using launcher::workers::kErrorFileLimit;
using launcher::workers::kErrorTextLimit;
using launcher::workers::read_error_file;
using launcher::workers::WorkerExit;

WorkerExit exit_with_file(const fs::path& path) {
  WorkerExit e;
  e.exit_code = 1;
  e.error_file = path.string();
  return e;
}

TEST(ErrorFileReadTest, ReadsTheMessageAndKeepsTheDocument) {
  TempDir dir;
  const std::string doc =
      R"({"message": {"message": "ValueError: bad batch", "extraInfo": {"py_callstack": "Traceback: t.py", "timestamp": "1"}}})";
  std::ofstream(dir.path / "error.json") << doc;
  WorkerExit e = exit_with_file(dir.path / "error.json");
  read_error_file(e);
  ASSERT_TRUE(e.error_text);
  EXPECT_EQ(*e.error_text, "ValueError: bad batch\nTraceback: t.py");
  ASSERT_TRUE(e.error_document);
  EXPECT_EQ(*e.error_document, doc);
}

TEST(ErrorFileReadTest, NoFileIsNoError) {
  TempDir dir;
  WorkerExit e = exit_with_file(dir.path / "error.json");
  read_error_file(e);
  EXPECT_FALSE(e.error_text);
  EXPECT_FALSE(e.error_document);
}

// Nobody writes the FIFO: the read returns at once, with nothing.
TEST(ErrorFileReadTest, AFifoIsNotWaitedOn) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir.path / "error.json").c_str(), 0600), 0);
  WorkerExit e = exit_with_file(dir.path / "error.json");
  read_error_file(e);
  EXPECT_FALSE(e.error_text);
  EXPECT_FALSE(e.error_document);
}

TEST(ErrorFileReadTest, ALinkIsNotFollowed) {
  TempDir dir;
  std::ofstream(dir.path / "other.json") << R"({"message": "not the worker's"})";
  fs::create_symlink(dir.path / "other.json", dir.path / "error.json");
  WorkerExit e = exit_with_file(dir.path / "error.json");
  read_error_file(e);
  EXPECT_FALSE(e.error_text);
  fs::remove(dir.path / "error.json");
  fs::create_symlink("/dev/zero", dir.path / "error.json");
  read_error_file(e);
  EXPECT_FALSE(e.error_text);
}

TEST(ErrorFileReadTest, AFileOverTheLimitIsReadToTheLimitAndSaysItWasCut) {
  TempDir dir;
  {
    std::ofstream out(dir.path / "error.json");
    out << R"({"message": ")" << std::string(kErrorFileLimit * 2, 'x') << R"("})";
  }
  WorkerExit e = exit_with_file(dir.path / "error.json");
  read_error_file(e);
  ASSERT_TRUE(e.error_document);
  EXPECT_EQ(e.error_document->size(), kErrorFileLimit);
  ASSERT_TRUE(e.error_text);
  EXPECT_LT(e.error_text->size(), kErrorTextLimit);
  EXPECT_EQ(e.error_text->rfind("(an error file over 1 MiB, cut) {\"message\": \"xxx", 0), 0u) << *e.error_text;
}

// A message within the file's bound but longer than what a record keeps: its start, and a note.
TEST(ErrorFileReadTest, ALongMessageIsKeptToItsBoundWithANote) {
  const std::string doc = R"({"message": ")" + std::string(kErrorTextLimit * 2, 'y') + R"("})";
  const auto text = error_message(doc);
  ASSERT_TRUE(text);
  EXPECT_GT(text->size(), kErrorTextLimit);
  EXPECT_LT(text->size(), kErrorTextLimit + 200);
  EXPECT_EQ(text->substr(0, kErrorTextLimit), std::string(kErrorTextLimit, 'y'));
}

TEST(ErrorFileReadTest, MessagesOfEachShape) {
  EXPECT_EQ(*error_message(R"({"message": "plain"})"), "plain");
  EXPECT_EQ(*error_message(R"({"message": {"message": "inner\n"}})"), "inner");
  EXPECT_EQ(*error_message("[1, 2]"), "[1, 2]");
  EXPECT_EQ(error_message("not json")->rfind("(unparseable error file) not json", 0), 0u);
  EXPECT_FALSE(error_message(""));
}

}  // namespace
}  // namespace ddprun::test
