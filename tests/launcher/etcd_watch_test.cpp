// The etcd client's watch (launcher/rendezvous/etcd) against an etcd member that misbehaves on its
// watch stream, played by a small HTTP server in this process: what the watch keeps of a message
// that never ends, and where it goes on from there.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "launcher/rendezvous/etcd/etcd_client.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;
namespace etcd = launcher::rendezvous::etcd;

// Answers /v3/watch with a chunked stream, as etcd's gateway does: the first stream says "created"
// and then `endless_mib` MiB of blanks that never end a message (and stays open); every later
// stream says "created" and one PUT of /k at revision 5.
class EndlessWatchServer {
 public:
  explicit EndlessWatchServer(size_t endless_mib) : endless_mib_(endless_mib) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("EndlessWatchServer: cannot listen");
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~EndlessWatchServer() {
    stop_ = true;
    thread_.join();
    for (int c : open_) ::close(c);
    ::close(fd_);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  int streams() const { return streams_; }

 private:
  static bool send_all(int c, const std::string& bytes) {
    size_t at = 0;
    while (at < bytes.size()) {
      const ssize_t n = ::send(c, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += static_cast<size_t>(n);
    }
    return true;
  }
  static std::string chunk(const std::string& body) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", body.size());
    return size + body + "\r\n";
  }
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) != 1) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      open_.push_back(c);
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {  // the header (the body is small: left unread)
        pollfd q{c, POLLIN, 0};
        if (::poll(&q, 1, 1000) != 1) break;
        const ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      if (request.rfind("POST /v3/watch ", 0) != 0) continue;
      const int stream = ++streams_;
      std::string answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
      answer += chunk(R"({"result":{"header":{"revision":"4"},"created":true}})"
                      "\n");
      if (!send_all(c, answer)) continue;
      if (stream == 1) {
        const std::string blanks(size_t{1} << 20, ' ');
        for (size_t i = 0; i < endless_mib_ && !stop_ && send_all(c, chunk(blanks)); ++i) {
        }
        continue;  // left open, and silent
      }
      send_all(c, chunk(R"({"result":{"header":{"revision":"5"},"events":[{"kv":{"key":"L2s=","value":"dg==",)"
                        R"("create_revision":"5","mod_revision":"5","version":"1"}}]}})"
                        "\n"));
    }
  }

  size_t endless_mib_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::vector<int> open_;
  std::atomic<bool> stop_{false};
  std::atomic<int> streams_{0};
  std::thread thread_;
};

// Before: a member whose watch stream never ended a message had all of it kept, and looked through
// again from its start on every read (a fake member sending blanks: ddprun at 87% of a CPU, its
// memory growing without end). Past 64 MiB the member is taken for a failed one now, and the watch
// resumes (here on the same, only, endpoint) from where it was, losing nothing.
TEST(EtcdWatchTest, AMessageThatNeverEndsIsTheMembersFailureAndTheWatchResumes) {
  EndlessWatchServer server(80);
  etcd::Options o;
  o.endpoints = {server.endpoint()};
  etcd::Client client(o);
  etcd::Watch watch(client, "/k", "", 5);
  std::vector<etcd::WatchEvent> events;
  const auto give_up = etcd::Client::after(60s);
  for (int i = 0; i < 60 && events.empty(); ++i) events = watch.next(1s, give_up);
  ASSERT_EQ(events.size(), 1u) << "streams opened: " << server.streams();
  EXPECT_EQ(events[0].type, etcd::WatchEvent::Type::Put);
  EXPECT_EQ(events[0].kv.key, "/k");
  EXPECT_EQ(events[0].kv.value, "v");
  EXPECT_EQ(server.streams(), 2);
  EXPECT_EQ(watch.next_revision(), 6);
}

}  // namespace
}  // namespace ddprun::test
