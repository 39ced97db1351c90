// Access control: a protected daemon, strangers in both dialects, two jobs that cannot touch each
// other, an agent without the secret, the worker store's allow list, private logs, a --log_dir
// that others can write.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "rendezvous/core/auth.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/core/protocol.hpp"
#include "tests/support/daemon.hpp"
#include "tests/support/ddprun_bin.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/raw_socket.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/job_node.hpp"
#include "tests/support/store_client.hpp"

namespace ddprun::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using rdzv::core::put_bytes;
using rdzv::core::put_u32;
using rdzv::core::put_u8;

constexpr const char* kSecret = "this-is-the-cluster-secret-0123456789";

// A private token file in `dir`.
std::string write_token(const TempDir& dir, const std::string& name, const std::string& content) {
  const std::string path = (dir.path / name).string();
  std::ofstream(path) << content;
  ::chmod(path.c_str(), 0600);
  return path;
}

// Node `rank` of a 2-node job `run_id` through the daemon on `daemon_port`, with the secret or token
// in `token_file` (when given).
std::unique_ptr<Subprocess> daemon_node(uint16_t daemon_port, int rank, const std::string& run_id,
                                        const std::string& token_file, std::vector<std::string> worker,
                                        std::vector<std::string> extra = {}) {
  return JobNode(rank)
      .meet(at_store(daemon_port, run_id))
      .conf("join_timeout=60" + (token_file.empty() ? "" : ",token_file=" + token_file))
      .flags(extra)
      .start(worker);
}

// A client with the cluster secret: sees every job.
rdzv::client::Client admin(uint16_t port) {
  auto o = test::store_client(port, 5s);
  o.credentials = rdzv::core::Credentials{"*", kSecret};
  return rdzv::client::Client(o);
}

// A daemon protected by kSecret, written to a file of this name in a directory of its own.
struct GuardedDaemon {
  explicit GuardedDaemon(const char* file)
      : token(write_token(dir, file, kSecret)), daemon(DAEMON_BIN, guarded(token)) {}
  static DaemonOptions guarded(const std::string& token) {
    DaemonOptions o;
    o.args = {"--token-file", token};
    return o;
  }
  TempDir dir;
  std::string token;
  Daemon daemon;
};

TEST(AccessTest, ProtectedModeRefusesANetworkAddressWithoutASecretAndInsecureStarts) {
  Subprocess refused({DAEMON_BIN, "--host", "0.0.0.0", "--port", "0"});
  const Finished r = refused.wait(10s);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("refusing to listen on 0.0.0.0 without a secret"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--token-file PATH"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--insecure"), std::string::npos) << r.err;
  Subprocess insecure({DAEMON_BIN, "--host", "0.0.0.0", "--port", "0", "--insecure"});
  EXPECT_TRUE(insecure.wait_for_output("listening on 0.0.0.0:", 10s)) << insecure.err();
  EXPECT_TRUE(insecure.wait_for_output("--insecure: anyone who can reach this port", 10s));
  TempDir dir;
  const std::string token = write_token(dir, "token", kSecret);
  Subprocess secured({DAEMON_BIN, "--host", "0.0.0.0", "--port", "0", "--token-file", token});
  EXPECT_TRUE(secured.wait_for_output("protected: clients must prove the secret", 10s)) << secured.err();
  ::chmod(token.c_str(), 0644);
  Subprocess readable({DAEMON_BIN, "--host", "127.0.0.1", "--port", "0", "--token-file", token});
  const Finished f = readable.wait(10s);
  EXPECT_EQ(f.exit_code, 2);
  EXPECT_NE(f.err.find("may be read by others"), std::string::npos) << f.err;
}

TEST(AccessTest, StrangersInBothDialectsCannotReadWriteStatusOrEndAJob) {
  GuardedDaemon guarded("token");
  const std::string& token = guarded.token;
  Daemon& d = guarded.daemon;
  auto n0 = daemon_node(d.port(), 0, "guarded", token, {TEST_WORKER_BIN, "wait-signal"});
  auto n1 = daemon_node(d.port(), 1, "guarded", token, {TEST_WORKER_BIN, "wait-signal"});
  ASSERT_TRUE(n0->wait_for_output("[rank0]: ready", 30s)) << n0->err();
  ASSERT_TRUE(n1->wait_for_output("[rank1]: ready", 30s)) << n1->err();
  auto keys = [&] { return admin(d.port()).list(); };
  const std::vector<std::string> before = keys();
  std::string end_key;
  for (const auto& k : before) {
    if (k.find("/r0/node/0") != std::string::npos) end_key = k.substr(0, k.find("/node/0")) + "/end";
  }
  ASSERT_FALSE(end_key.empty());

  {  // A 1.13 client (no handshake at all) tries to end the job: closed, nothing written.
    RawSocket legacy(d.port());
    std::string set;
    put_u8(set, 0);  // 1.13 SET
    put_bytes(set, end_key);
    put_bytes(set, "signal:stranger");
    legacy.send(set);
    EXPECT_TRUE(legacy.read_until_eof(nullptr, 10s));
  }
  {  // A 2.x client reads a node's record: closed, nothing answered.
    RawSocket v2(d.port());
    std::string get;
    put_u8(get, 0);
    put_u32(get, rdzv::core::kValidateMagic);
    put_u8(get, 3);  // 2.x GET
    put_bytes(get, before.front());
    v2.send(get);
    std::string got;
    EXPECT_TRUE(v2.read_until_eof(&got, 10s));
    EXPECT_EQ(got, "");
  }
  // ddprun's client without a secret, or with a wrong one: refused with a reason (a wrong proof
  // at the first reply the client reads: the proof is pipelined with the first request).
  EXPECT_THROW(rdzv::client::Client c(test::store_client(d.port(), 5s)), ConfigError);
  auto wrong = test::store_client(d.port(), 5s);
  wrong.credentials = rdzv::core::Credentials{"*", "not-the-secret-at-all-0123"};
  rdzv::client::Client refused(wrong);
  EXPECT_THROW(refused.ping(), ConfigError);
  // status without the secret gets nothing.
  Subprocess status({DAEMON_BIN, "status", "--endpoint", "127.0.0.1:" + std::to_string(d.port())});
  const Finished st = status.wait(10s);
  EXPECT_EQ(st.exit_code, 1);
  EXPECT_NE(st.err.find("protected by a secret"), std::string::npos) << st.err;
  EXPECT_EQ(st.out.find("guarded"), std::string::npos) << st.out;
  // A bare IPv6 address is the daemon's host on its default port, never split at a colon.
  const Finished v6 = Subprocess({DAEMON_BIN, "status", "--endpoint", "::1"}).wait(30s);
  EXPECT_NE(v6.exit_code, 2) << v6.err;
  EXPECT_EQ(v6.err.find("--endpoint expects"), std::string::npos) << v6.err;
  if (v6.exit_code == 1) {
    EXPECT_NE(v6.err.find("[::1]:29400"), std::string::npos) << v6.err;
  }
  // The job was not touched: no end, and it still runs; with the secret, status shows it.
  EXPECT_FALSE(admin(d.port()).check({end_key}));
  Subprocess allowed(
      {DAEMON_BIN, "status", "--endpoint", "127.0.0.1:" + std::to_string(d.port()), "--token-file", token});
  const Finished ok = allowed.wait(10s);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["jobs"][0]["state"], "running") << ok.out;
  n0->signal(SIGTERM);
  EXPECT_EQ(n0->wait(30s).exit_code, 128 + SIGTERM);
  EXPECT_EQ(n1->wait(30s).exit_code, 128 + SIGTERM);
  // Refusals from one address: the first in full, the rest counted (at the latest at shutdown).
  d.stop(SIGTERM);
  EXPECT_EQ(d.log_count("access denied"), 1u) << d.log();
  EXPECT_NE(d.log().find("more refused connections from 127.0.0.1 in the last"), std::string::npos) << d.log();
}

TEST(AccessTest, TwoJobsOnOneDaemonCannotTouchEachOther) {
  GuardedDaemon guarded("cluster");
  const std::string& token = guarded.token;
  Daemon& d = guarded.daemon;
  const TempDir& dir = guarded.dir;
  // Each job gets only its own token, derived from the daemon's secret.
  for (const char* job : {"alpha", "beta"}) {
    Subprocess t({DAEMON_BIN, "token", "--token-file", token, "--rdzv_id", job, "--output",
                  (dir.path / (std::string(job) + ".token")).string()});
    ASSERT_EQ(t.wait(10s).exit_code, 0);
    struct stat st {};
    ASSERT_EQ(::stat((dir.path / (std::string(job) + ".token")).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  const std::string alpha = (dir.path / "alpha.token").string(), beta = (dir.path / "beta.token").string();
  auto a0 = daemon_node(d.port(), 0, "alpha", alpha, {TEST_WORKER_BIN, "wait-signal"});
  auto a1 = daemon_node(d.port(), 1, "alpha", alpha, {TEST_WORKER_BIN, "wait-signal"});
  ASSERT_TRUE(a0->wait_for_output("[rank0]: ready", 30s)) << a0->err();
  ASSERT_TRUE(a1->wait_for_output("[rank1]: ready", 30s)) << a1->err();
  // beta's token cannot act for alpha: refused at the start, naming the mismatch.
  auto impostor = daemon_node(d.port(), 0, "alpha", beta, {TEST_WORKER_BIN, "print", "1"});
  const Finished f = impostor->wait(20s);
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find("is for job 'beta', not 'alpha'"), std::string::npos) << f.err;
  // beta's agents, authenticated for beta, cannot read or end alpha.
  auto o_beta = test::store_client(d.port(), 5s);
  o_beta.credentials = rdzv::core::credentials_for(rdzv::core::read_token_file(beta), "beta", beta);
  rdzv::client::Client b(o_beta);
  b.set("/ddprun/beta/gen", "1");                   // its own keys: fine
  b.set("/ddprun/alpha/g1/r0/end", "signal:beta");  // SET has no reply...
  EXPECT_THROW(b.ping(), ConnectionError);          // ...but the store closed the connection on it
  EXPECT_THROW(b.get("/ddprun/alpha/gen", 1s), ConnectionError);
  EXPECT_EQ(b.list(), (std::vector<std::string>{"/ddprun/beta/gen"})) << "LIST shows a job its own keys only";
  EXPECT_FALSE(admin(d.port()).check({"/ddprun/alpha/g1/r0/end"}));
  // status with beta's token shows beta alone.
  Subprocess status(
      {DAEMON_BIN, "status", "--endpoint", "127.0.0.1:" + std::to_string(d.port()), "--token-file", beta});
  const Finished st = status.wait(10s);
  ASSERT_EQ(st.exit_code, 0) << st.err;
  EXPECT_EQ(st.out.find("alpha"), std::string::npos) << st.out;
  a0->signal(SIGTERM);
  a0->wait(30s);
  a1->wait(30s);
}

TEST(AccessTest, AnAgentWithoutTheSecretExitsAtOnceSayingHowToGiveIt) {
  TempDir dir;
  DaemonOptions o;
  o.args = {"--token-file", write_token(dir, "token", kSecret)};
  Daemon d(DAEMON_BIN, o);
  auto n = daemon_node(d.port(), 0, "job", "", {TEST_WORKER_BIN, "print", "1"});  // join timeout 60 s
  const Finished f = n->wait(20s);
  EXPECT_FALSE(f.timed_out) << "it must not wait for the join timeout";
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find("protected by a secret"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("--rdzv_conf token_file=PATH, or DDPRUN_TOKEN_FILE=PATH"), std::string::npos) << f.err;
}

TEST(AccessTest, TheWorkerStoreAdmitsOnlyTheJobsNodes) {
  const int port = free_port();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int rank = 0; rank < 2; ++rank) {
    nodes.push_back(JobNode(rank).meet(at_master(port)).conf("").start({TEST_WORKER_BIN, "wait-signal"}));
  }
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(nodes[rank]->wait_for_output("[rank" + std::to_string(rank) + "]: ready", 30s)) << nodes[rank]->err();
  }
  const std::string line = logged_value(nodes[0]->err(), "MASTER_PORT=");
  ASSERT_FALSE(line.empty());
  const auto worker_port = static_cast<uint16_t>(std::stoi(line.substr(12)));
  std::string ping;
  put_u8(ping, 0);
  put_u32(ping, rdzv::core::kValidateMagic);
  put_u8(ping, 13);
  put_u32(ping, 42);
  // From an address that is not one of the job's nodes: held unread for the store's admission
  // grace (10 s: a node may learn of a round before the host does), then closed, never answered.
  {
    RawSocket stranger(worker_port, "127.0.0.1", "127.0.0.9");
    stranger.send(ping);
    std::string got;
    EXPECT_TRUE(stranger.read_until_eof(&got, 60s));
    EXPECT_EQ(got, "");
  }
  // From node 1's address, as its workers connect: served.
  {
    RawSocket member(worker_port, "127.0.0.1", "127.0.0.2");
    member.send(ping);
    EXPECT_EQ(member.recv_exact(4).size(), 4u);
  }
  nodes[0]->signal(SIGTERM);
  const Finished f0 = nodes[0]->wait(30s);
  nodes[1]->wait(30s);
  EXPECT_NE(f0.err.find("refused a connection from 127.0.0.9: not one of this job's nodes"), std::string::npos)
      << f0.err;
}

TEST(AccessTest, WorkerLogsAreReadableByTheirOwnerAlone) {
  TempDir dir;
  Subprocess p({DDPRUN_BIN, "--nproc_per_node", "1", "--log_dir", dir.str(), "--tee", "3", TEST_WORKER_BIN, "print",
                "1", "error-file", "private"});
  const Finished f = p.wait(30s);
  ASSERT_EQ(f.exit_code, 1) << f.err;
  int dirs = 0, files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.path)) {
    struct stat st {};
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    if (S_ISDIR(st.st_mode)) {
      ++dirs;
      EXPECT_EQ(st.st_mode & 0777, 0700u) << e.path();
    } else if (e.path().filename() != "error.json") {  // the worker writes that one, inside a 0700 directory
      ++files;
      EXPECT_EQ(st.st_mode & 0777, 0600u) << e.path();
    }
  }
  EXPECT_GE(dirs, 3);  // run, attempt, rank
  // stdout.log, stderr.log, progress (the rank's progress page), python/sitecustomize.py (the hook)
  EXPECT_EQ(files, 4);
}

// A --log_dir under a directory every user may write (no sticky bit): another user could rename
// the run directory away and put one of their own, with their own python/sitecustomize.py, in its
// place. Refused before any worker runs, with what to do; the same under a sticky one is fine.
TEST(AccessTest, ALogDirUnderADirectoryOthersCanWriteIsRefused) {
  TempDir dir;
  const fs::path shared = dir.path / "shared";
  fs::create_directory(shared);
  fs::permissions(shared, fs::perms::all, fs::perm_options::replace);  // 0777
  const fs::path ready = dir.path / "ready";
  Subprocess p(ddprun({"--nproc_per_node", "1", "--log_dir", (shared / "logs").string(), TEST_WORKER_BIN, "ready-file",
                       ready.string()}));
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find(shared.string() + " is writable by every user without the sticky bit"), std::string::npos)
      << f.err;
  EXPECT_FALSE(fs::exists(ready));

  fs::permissions(shared, fs::perms::all | fs::perms::sticky_bit, fs::perm_options::replace);  // 1777, as /tmp
  Subprocess sticky(ddprun({"--nproc_per_node", "1", "--log_dir", (shared / "logs").string(), TEST_WORKER_BIN,
                            "ready-file", ready.string()}));
  const Finished ok = sticky.wait(30s);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(fs::exists(ready));
}

// A --log_dir that is a link (of this user's, in a private directory) to a directory every user may
// write: judged by where it leads, and refused.
TEST(AccessTest, ALogDirLinkedIntoADirectoryOthersCanWriteIsRefused) {
  TempDir dir;
  const fs::path shared = dir.path / "shared";
  fs::create_directory(shared);
  fs::permissions(shared, fs::perms::all, fs::perm_options::replace);  // 0777
  fs::create_directory_symlink(shared, dir.path / "logs");
  Subprocess p(
      ddprun({"--nproc_per_node", "1", "--log_dir", (dir.path / "logs").string(), TEST_WORKER_BIN, "print", "1"}));
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find(shared.string() + " is writable by every user without the sticky bit"), std::string::npos)
      << f.err;
  EXPECT_TRUE(fs::is_empty(shared));
}

// The --log_dir itself writable by its group: refused the same way.
TEST(AccessTest, ALogDirItsGroupCanWriteIsRefused) {
  TempDir dir;
  const fs::path logs = dir.path / "logs";
  fs::create_directory(logs);
  fs::permissions(logs, fs::perms::owner_all | fs::perms::group_all, fs::perm_options::replace);  // 0770
  Subprocess p(ddprun({"--nproc_per_node", "1", "--log_dir", logs.string(), TEST_WORKER_BIN, "print", "1"}));
  const Finished f = p.wait(30s);
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find(logs.string() + " is writable by its group without the sticky bit"), std::string::npos) << f.err;
}

TEST(AccessTest, RealPyTorchGlooWorkersTrainThroughAProtectedDaemon) {
  if (::access(TORCH_PYTHON, X_OK) != 0) GTEST_SKIP() << TORCH_PYTHON << " is not here";
  GuardedDaemon guarded("token");
  const std::string& token = guarded.token;
  Daemon& d = guarded.daemon;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int rank = 0; rank < 2; ++rank) {
    nodes.push_back(JobNode(rank)
                        .meet(at_store(d.port(), "torch"))
                        .conf("token_file=" + token)
                        .flags({"--nproc_per_node", "2"})
                        .env({{"PYTHON_EXEC", TORCH_PYTHON}, {"OMP_NUM_THREADS", "1"}})
                        .start({GLOO_WORKER_PY}));
  }
  for (int rank = 0; rank < 2; ++rank) {
    const Finished f = nodes[rank]->wait(180s);
    ASSERT_EQ(f.exit_code, 0) << f.err;
    for (int lr = 0; lr < 2; ++lr) {
      const int r = rank * 2 + lr;
      EXPECT_NE(f.out.find("[rank" + std::to_string(r) + "]: rank " + std::to_string(r) + " ok"), std::string::npos)
          << f.out;
    }
  }
}

}  // namespace
}  // namespace ddprun::test
