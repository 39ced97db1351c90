// /proc readers (common/procfs) on real processes and sockets.
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/procfs.hpp"
#include "tests/support/wait_until.hpp"

namespace ddprun::launcher {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

TEST(ProcfsTest, KernelEndpointsDecodeForIpv4Ipv6AndMappedAddresses) {
  uint16_t port = 0;
  EXPECT_EQ(procfs::decode_proc_endpoint("0100007F:1F90", &port), "127.0.0.1:8080");
  EXPECT_EQ(port, 8080);
  EXPECT_EQ(procfs::decode_proc_endpoint("00000000000000000000000001000000:0050"), "[::1]:80");
  EXPECT_EQ(procfs::decode_proc_endpoint("0000000000000000FFFF00000100007F:0050"), "127.0.0.1:80");
  EXPECT_FALSE(procfs::decode_proc_endpoint("0100007G:0050"));
  EXPECT_FALSE(procfs::decode_proc_endpoint("0100007F"));
  EXPECT_FALSE(procfs::decode_proc_endpoint("0100007F:123456"));
  EXPECT_EQ(procfs::normalize_endpoint("[::ffff:10.1.2.3]:29500"), "10.1.2.3:29500");
  EXPECT_EQ(procfs::normalize_endpoint("[fe80::1]:29500"), "[fe80::1]:29500");
}

TEST(ProcfsTest, TheTreeItsCpuTimeAndItsConnectionsAreReadFromRealProcesses) {
  // A busy child with a sleeping grandchild.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::setpgid(0, 0);
    if (::fork() == 0) {
      ::pause();
      ::_exit(0);
    }
    [[maybe_unused]] auto n = ::write(ready[1], "x", 1);
    std::atomic<uint64_t> spin{0};
    for (;;) spin.fetch_add(1, std::memory_order_relaxed);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  // The grandchild exists once its fork has returned in the child, which wrote `ready` after it.
  std::vector<pid_t> tree;
  EXPECT_TRUE(test::wait_until(
      [&] {
        tree = procfs::process_tree(child);
        return tree.size() == 2u;
      },
      10s))
      << tree.size();
  const uint64_t before = procfs::tree_cpu_ticks(tree);
  // The child burns CPU: its tree's ticks grow.
  EXPECT_TRUE(test::wait_until([&] { return procfs::tree_cpu_ticks(tree) > before; }, 10s));
  const auto st = procfs::read_stat(child);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->pgid, child);
  ::kill(-child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);

  // This process's own loopback connection, seen from both ends.
  const int server = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(server, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const int accepted = ::accept(server, nullptr, nullptr);
  sockaddr_in local{};
  len = sizeof local;
  ::getsockname(client, reinterpret_cast<sockaddr*>(&local), &len);
  const std::string expected = "127.0.0.1:" + std::to_string(ntohs(local.sin_port));
  bool found = false;
  for (const auto& conn : procfs::tcp_connections({::getpid()})) {
    if (conn.local == expected && conn.remote_port == ntohs(addr.sin_port)) found = true;
  }
  EXPECT_TRUE(found) << expected;
  for (int fd : {client, accepted, server}) ::close(fd);
}

// --- stacks -------------------------------------------------------------------------------------

}  // namespace
}  // namespace ddprun::launcher
