// The secret handshake and the job scope, on one connection without sockets; token files.
#include "rendezvous/core/auth.hpp"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <fstream>

#include "common/errors.hpp"
#include "rendezvous/core/store_connection.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::rdzv::core {
namespace {

std::string v2(uint8_t op) {
  std::string s;
  put_u8(s, op);
  return s;
}
std::string hello(const std::string& scope, const std::string& nonce) {
  std::string s;
  put_u8(s, 0);
  put_u32(s, kValidateMagic);
  put_u8(s, kAuthHelloWire);
  put_u32(s, kAuthVersion);
  put_bytes(s, scope);
  put_bytes(s, nonce);
  return s;
}
std::string proof(const std::string& mac) {
  std::string s = v2(kAuthProofWire);
  put_bytes(s, mac);
  return s;
}
std::string set(const std::string& k, const std::string& v) {
  std::string s = v2(1);
  put_bytes(s, k);
  put_bytes(s, v);
  return s;
}
std::string get(const std::string& k) {
  std::string s = v2(3);
  put_bytes(s, k);
  return s;
}

// A client's side of the handshake against one StoreConnection.
struct Handshake {
  KvStore& store;
  Limits limits;
  StoreSecret secret;
  StoreConnection conn;
  Handshake(KvStore& s, StoreSecret sec) : store(s), secret(std::move(sec)), conn(store, limits, nullptr, &secret) {}

  // Returns whether the store accepted the proof made with `key` for `scope`.
  bool authenticate(const std::string& scope, const std::string& key) {
    const std::string nonce = random_nonce();
    conn.consume(hello(scope, nonce));
    const std::string reply = conn.output().take_all();
    EXPECT_EQ(reply[0], kAuthProveSaysRefusal) << "a protected store challenges, and says its refusals";
    const std::string server_nonce = reply.substr(9);
    try {
      conn.consume(proof(client_mac(key, scope, nonce, server_nonce)));
    } catch (const AccessDenied&) {
      // Said before the close: a client tells a refused secret from a lost connection.
      EXPECT_EQ(conn.output().take_all(), std::string(1, static_cast<char>(kProofRefused)));
      return false;
    }
    const std::string ok = conn.output().take_all();
    EXPECT_EQ(ok.substr(9), server_mac(key, scope, nonce, server_nonce)) << "the store proves the key too";
    return true;
  }
};

core::StoreSecret cluster(const std::string& s) {
  StoreSecret sec;
  sec.cluster = s;
  return sec;
}

TEST(AuthTest, AnUnprovenConnectionTouchesNothing) {
  KvStore store;
  Handshake h(store, cluster("0123456789abcdef-cluster"));
  std::string hs;
  put_u8(hs, 0);
  put_u32(hs, kValidateMagic);
  put_u8(hs, 13);  // PING is allowed: it touches nothing
  put_u32(hs, 7);
  h.conn.consume(hs);
  EXPECT_EQ(h.conn.output().take_all().size(), 4u);
  EXPECT_THROW(h.conn.consume(set("/ddprun/job/g1/end", "signal:x")), AccessDenied);
  EXPECT_EQ(store.num_keys(), 0u);
}

TEST(AuthTest, JobScopeAdmitsItsOwnKeysOnly) {
  KvStore store;
  store.set("/ddprun/other/g1/r0/end", "success");
  const std::string secret = "0123456789abcdef-cluster";
  Handshake h(store, cluster(secret));
  ASSERT_TRUE(h.authenticate("job", job_key(secret, "job")));
  h.conn.consume(set("/ddprun/job/g1/r0/node/0", "{}"));
  EXPECT_EQ(store.num_keys(), 2u);
  EXPECT_THROW(h.conn.consume(get("/ddprun/other/g1/r0/end")), AccessDenied);
  Handshake h2(store, cluster(secret));
  ASSERT_TRUE(h2.authenticate("job", job_key(secret, "job")));
  EXPECT_THROW(h2.conn.consume(set("/ddprun/jobx/g1/r0/end", "signal:x")), AccessDenied) << "a prefix is not a job";
  EXPECT_EQ(*store.get("/ddprun/other/g1/r0/end"), "success");
}

TEST(AuthTest, WrongKeysAndOtherJobsTokensAreRefused) {
  KvStore store;
  const std::string secret = "0123456789abcdef-cluster";
  EXPECT_FALSE(Handshake(store, cluster(secret)).authenticate("job", job_key("another-secret-entirely", "job")));
  EXPECT_FALSE(Handshake(store, cluster(secret)).authenticate("job", job_key(secret, "other")));
  EXPECT_FALSE(Handshake(store, cluster(secret)).authenticate("*", job_key(secret, "job")));
  EXPECT_TRUE(Handshake(store, cluster(secret)).authenticate("*", secret));
  // A store hosted by an agent that holds only its job's token serves that job alone.
  StoreSecret only_job;
  only_job.job_id = "job";
  only_job.job_key = job_key(secret, "job");
  EXPECT_TRUE(Handshake(store, only_job).authenticate("job", job_key(secret, "job")));
  EXPECT_FALSE(Handshake(store, only_job).authenticate("*", secret));
}

TEST(AuthTest, AnOpenStoreAnswersTheHelloAndAsksForNothing) {
  KvStore store;
  Limits limits;
  StoreConnection conn(store, limits, nullptr);
  conn.consume(hello("", random_nonce()));
  const std::string reply = conn.output().take_all();
  ASSERT_EQ(reply.size(), 9u);
  EXPECT_EQ(reply[0], 0);
  conn.consume(set("k", "v"));
  EXPECT_EQ(store.num_keys(), 1u);
}

TEST(AuthTest, TokenFilesMustBePrivateAndWellFormed) {
  test::TempDir dir;
  const std::string path = (dir.path / "token").string();
  std::ofstream(path) << "0123456789abcdef-cluster\n";
  ::chmod(path.c_str(), 0644);
  try {
    read_token_file(path);
    FAIL() << "a token file others can read must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("chmod 600 " + path), std::string::npos) << e.what();
  }
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(read_token_file(path).cluster_secret, "0123456789abcdef-cluster");
  std::ofstream(path) << "short";
  EXPECT_THROW(read_token_file(path), ConfigError);
  // A job token: for that job only.
  std::ofstream(path) << format_job_token("0123456789abcdef-cluster", "job-7");
  const Token t = read_token_file(path);
  ASSERT_TRUE(t.run_id);
  EXPECT_EQ(*t.run_id, "job-7");
  EXPECT_EQ(credentials_for(t, "job-7", path).key, job_key("0123456789abcdef-cluster", "job-7"));
  EXPECT_THROW(credentials_for(t, "job-8", path), ConfigError);
  // It serves the job's replica groups (ddprun --replica_group: run ids "job-7.rg<N>"), with the
  // keys the cluster secret's holder derives for them, and no other job's.
  const auto group3 = credentials_for(t, "job-7.rg3", path);
  EXPECT_EQ(group3.scope, "job-7.rg3");
  EXPECT_EQ(group3.key, job_key("0123456789abcdef-cluster", "job-7.rg3"));
  EXPECT_NE(group3.key, job_key("0123456789abcdef-cluster", "job-7"));
  EXPECT_NE(group3.key, credentials_for(t, "job-7.rg4", path).key);
  for (const char* other : {"job-8.rg3", "job-7x.rg3", "job-7.rgx", "job-7.rg", "job-7rg3", ".rg3"})
    EXPECT_THROW(credentials_for(t, other, path), ConfigError) << other;
  // A store hosted with the job's token takes its groups' proofs too.
  const StoreSecret hosted = store_secret(t);
  EXPECT_EQ(hosted.key_for("job-7.rg3"), group3.key);
  EXPECT_EQ(hosted.key_for("job-7"), job_key("0123456789abcdef-cluster", "job-7"));
  EXPECT_FALSE(hosted.key_for("job-8.rg3"));
  EXPECT_FALSE(hosted.key_for(kAllJobs));
}

TEST(AuthTest, ReplicaGroupRunIdsNameTheirJob) {
  EXPECT_EQ(replica_group_of("train.rg12"), std::make_pair(std::string_view("train"), std::string_view("12")));
  EXPECT_EQ(replica_group_of("a.rg1.rg2"), std::make_pair(std::string_view("a.rg1"), std::string_view("2")));
  for (const char* plain : {"train", "train.rg", "train.rgx", ".rg1", "train.rg1x", "train.rg1234567890"})
    EXPECT_FALSE(replica_group_of(plain)) << plain;
}

}  // namespace
}  // namespace ddprun::rdzv::core
