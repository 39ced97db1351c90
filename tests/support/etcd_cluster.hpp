#pragma once
// Test helper: a real etcd cluster (Debian's etcd-server) of one or more members on loopback ports,
// each member in its own process with its data and log under a temporary directory; optionally
// serving its clients over TLS. Every member is SIGKILLed at scope exit.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "launcher/rendezvous/etcd/etcd_client.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::test {

inline bool have_etcd() { return ::access("/usr/bin/etcd", X_OK) == 0 && ::access("/usr/bin/etcdctl", X_OK) == 0; }

// A CA and a server certificate for 127.0.0.1 and localhost, made with the openssl command.
struct TestCertificates {
  TempDir dir;
  std::string ca, cert, key;
  TestCertificates() {
    const std::string d = dir.str();
    ca = d + "/ca.crt";
    cert = d + "/server.crt";
    key = d + "/server.key";
    const std::string script =
        "cd " + d +
        " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 "
        "-subj /CN=ddprun-test-ca && openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
        "-subj /CN=localhost && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > ext.cnf && openssl x509 -req "
        "-in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 1 -extfile ext.cnf";
    if (std::system(("(" + script + ") >/dev/null 2>&1").c_str()) != 0) throw std::runtime_error("openssl failed");
  }
};

class EtcdCluster {
 public:
  explicit EtcdCluster(int members, const TestCertificates* tls = nullptr) : tls_(tls) {
    for (int i = 0; i < members; ++i) {
      client_ports_.push_back(free_port());
      peer_ports_.push_back(free_port());
    }
    std::string initial;
    for (int i = 0; i < members; ++i) {
      initial += (i ? "," : "") + name(i) + "=http://127.0.0.1:" + std::to_string(peer_ports_[i]);
    }
    initial_ = initial;
    pids_.assign(static_cast<size_t>(members), -1);
    for (int i = 0; i < members; ++i) start(i, initial);
    if (!wait_healthy(std::chrono::seconds(30))) throw std::runtime_error("etcd did not become healthy: " + log(0));
  }
  ~EtcdCluster() {
    for (size_t i = 0; i < pids_.size(); ++i) kill(static_cast<int>(i));
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  std::string endpoint(int i) const {
    return std::string(tls_ ? "https" : "http") +
           "://127.0.0.1:" + std::to_string(client_ports_[static_cast<size_t>(i)]);
  }
  // Every member's client URL, comma-separated (for --rdzv_endpoint).
  std::string endpoints() const {
    std::string out;
    for (size_t i = 0; i < client_ports_.size(); ++i) out += (i ? "," : "") + endpoint(static_cast<int>(i));
    return out;
  }
  void kill(int i) {
    pid_t& pid = pids_[static_cast<size_t>(i)];
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  // Starts member i again after kill(i), from its data directory (a member that crashed and came back).
  void restart(int i) {
    if (pids_[static_cast<size_t>(i)] <= 0) start(i, initial_);
  }
  // Freezes member i (SIGSTOP) or lets it go on (SIGCONT): two of three frozen lose the quorum.
  void pause(int i) { ::kill(pids_[static_cast<size_t>(i)], SIGSTOP); }
  void resume(int i) { ::kill(pids_[static_cast<size_t>(i)], SIGCONT); }
  std::string log(int i) const {
    std::ifstream in((dir_.path / (name(i) + ".log")).string());
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
  }
  // etcdctl against the live members; its output.
  std::string etcdctl(const std::string& args) const {
    std::string cmd = "ETCDCTL_API=3 /usr/bin/etcdctl --endpoints " + live_endpoints();
    if (tls_) cmd += " --cacert " + tls_->ca;
    cmd += " " + args + " 2>&1";
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
      ::pclose(p);
    }
    return out;
  }
  bool wait_healthy(std::chrono::seconds timeout) const {
    launcher::rendezvous::etcd::Options o;
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (pids_[i] > 0) o.endpoints.push_back(endpoint(static_cast<int>(i)));
    }
    if (tls_) o.ca_file = tls_->ca;
    launcher::rendezvous::etcd::Client c(o);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      try {
        c.put("/health-check", "1", 0, launcher::rendezvous::etcd::Client::after(std::chrono::seconds(2)));
        return true;
      } catch (const std::exception& e) {
        if (std::string(e.what()).find("authentication") != std::string::npos ||
            std::string(e.what()).find("user name is empty") != std::string::npos) {
          return true;  // auth is on: it answers
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // sleep override: etcd starting
    }
    return false;
  }

 private:
  static std::string name(int i) { return "m" + std::to_string(i); }

  std::string live_endpoints() const {
    std::string out;
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (pids_[i] > 0) out += (out.empty() ? "" : ",") + endpoint(static_cast<int>(i));
    }
    return out;
  }

  void start(int i, const std::string& initial) {
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_ports_[static_cast<size_t>(i)]);
    std::vector<std::string> argv{"/usr/bin/etcd",
                                  "--name",
                                  name(i),
                                  "--data-dir",
                                  (dir_.path / name(i)).string(),
                                  "--listen-client-urls",
                                  endpoint(i),
                                  "--advertise-client-urls",
                                  endpoint(i),
                                  "--listen-peer-urls",
                                  peer,
                                  "--initial-advertise-peer-urls",
                                  peer,
                                  "--initial-cluster",
                                  initial,
                                  "--initial-cluster-state",
                                  "new",
                                  "--initial-cluster-token",
                                  "ddprun-test"};
    if (tls_) {
      for (const std::string& a : {std::string("--cert-file"), tls_->cert, std::string("--key-file"), tls_->key}) {
        argv.push_back(a);
      }
    }
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const std::string log_path = (dir_.path / (name(i) + ".log")).string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close_range(3, ~0U, 0);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    pids_[static_cast<size_t>(i)] = pid;
  }

  TempDir dir_;
  const TestCertificates* tls_;
  std::vector<int> client_ports_, peer_ports_;
  std::vector<pid_t> pids_;
  std::string initial_;
};

}  // namespace ddprun::test
