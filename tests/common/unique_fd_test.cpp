// common/unique_fd.hpp: each descriptor closed exactly once, by its last owner.
#include "common/unique_fd.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace ddprun {
namespace {

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

int open_null() {
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  return fd;
}

TEST(UniqueFdTest, TheOwnerClosesItsDescriptorWhenItGoes) {
  int raw = -1;
  {
    const UniqueFd fd(open_null());
    raw = fd.get();
    EXPECT_TRUE(fd);
    EXPECT_TRUE(is_open(raw));
  }
  EXPECT_FALSE(is_open(raw));
}

TEST(UniqueFdTest, AMoveHandsOverOwnershipAndAssignmentClosesTheOldOne) {
  UniqueFd a(open_null());
  const int first = a.get();
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from is empty, by contract
  EXPECT_EQ(b.get(), first);
  UniqueFd c(open_null());
  const int second = c.get();
  c = std::move(b);
  EXPECT_FALSE(is_open(second));  // c's own was closed when it took b's
  EXPECT_EQ(c.get(), first);
  EXPECT_TRUE(is_open(first));
  UniqueFd& same = c;
  c = std::move(same);  // assigned to itself, it keeps its descriptor
  EXPECT_TRUE(is_open(first));
}

TEST(UniqueFdTest, ReleaseGivesItUpOpenAndResetToItselfKeepsIt) {
  UniqueFd fd(open_null());
  const int raw = fd.get();
  fd.reset(raw);
  EXPECT_TRUE(is_open(raw));
  EXPECT_EQ(fd.release(), raw);
  EXPECT_FALSE(fd);
  EXPECT_TRUE(is_open(raw));
  ::close(raw);
}

TEST(UniqueFdTest, CloseReportsTheResultOnceAndLeavesNothingToCloseTwice) {
  UniqueFd fd(open_null());
  const int raw = fd.get();
  EXPECT_EQ(fd.close(), 0);
  EXPECT_FALSE(is_open(raw));
  EXPECT_FALSE(fd);
  errno = 0;
  EXPECT_EQ(fd.close(), -1);
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
}  // namespace ddprun
