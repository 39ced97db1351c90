#include "rendezvous/core/kv_store.hpp"

#include <gtest/gtest.h>

#include <array>

#include "common/errors.hpp"

namespace ddprun::rdzv::core {
namespace {

struct RecordingWaiter : Waiter {
  int completed = 0;
  std::vector<std::tuple<uint8_t, std::string, std::string, std::string>> events;
  void on_wait_complete() override { ++completed; }
  void on_watch_event(uint8_t e, std::string_view k, const SharedBytes& o, const SharedBytes& n) override {
    events.emplace_back(e, std::string(k), o ? *o : std::string(), n ? *n : std::string());
  }
};

// A store with two clients waiting on one key.
struct TwoWaiters {
  explicit TwoWaiters(std::string_view key) : keys{key} {
    s.wait(w1, keys);
    s.wait(w2, keys);
  }
  int woken() const { return w1.completed + w2.completed; }
  KvStore s;
  RecordingWaiter w1, w2;
  std::array<std::string_view, 1> keys;
};

TEST(KvStoreTest, AddTreatsMissingAsZeroAndStoresDecimalText) {
  KvStore s;
  EXPECT_EQ(s.add("cnt", 5), 5);
  EXPECT_EQ(s.add("cnt", -2), 3);
  EXPECT_EQ(*s.get("cnt"), "3");
  s.set("n", "+41");
  EXPECT_EQ(s.add("n", 1), 42);
}

TEST(KvStoreTest, AddOnNonNumericValueThrowsAndKeepsTheValue) {
  KvStore s;
  s.set("k", "hello");
  EXPECT_THROW(s.add("k", 1), ProtocolError);
  EXPECT_EQ(*s.get("k"), "hello");
  s.set("big", "9223372036854775807");
  EXPECT_THROW(s.add("big", 1), ProtocolError);
  s.set("empty", "");
  EXPECT_THROW(s.add("empty", 1), ProtocolError);
}

TEST(KvStoreTest, CompareSetFollowsPyTorchMissingKeyRules) {
  KvStore s;
  EXPECT_EQ(*s.compare_set("a", "exp", "new"), "exp");  // missing, expected non-empty: nothing stored
  EXPECT_EQ(s.get("a"), nullptr);
  EXPECT_EQ(*s.compare_set("a", "", "new"), "new");  // missing, expected empty: created
  EXPECT_EQ(*s.get("a"), "new");
  EXPECT_EQ(*s.compare_set("a", "wrong", "x"), "new");  // mismatch: current returned
  EXPECT_EQ(*s.compare_set("a", "new", "x"), "x");      // match: replaced
}

TEST(KvStoreTest, WaitReturnsWhenLastKeyIsSet) {
  KvStore s;
  RecordingWaiter w;
  const std::array<std::string_view, 2> keys{"a", "b"};
  EXPECT_FALSE(s.wait(w, keys));
  EXPECT_EQ(s.missing_keys(w), 2u);
  s.set("a", "1");
  EXPECT_EQ(w.completed, 0);
  s.add("b", 1);
  EXPECT_EQ(w.completed, 1);
  EXPECT_FALSE(s.has_pending_wait(w));
  EXPECT_TRUE(s.wait(w, keys));  // all present now: immediate
}

TEST(KvStoreTest, CancelAndForgetClearWaitState) {
  TwoWaiters t("k");
  EXPECT_EQ(t.s.waiting_clients(), 2u);
  EXPECT_TRUE(t.s.cancel_wait(t.w1));
  t.s.forget(t.w2);
  EXPECT_EQ(t.s.waiting_clients(), 0u);
  t.s.set("k", "v");
  EXPECT_EQ(t.woken(), 0);
}

TEST(KvStoreTest, NumKeysCountsInitKeyButNotQueues) {
  KvStore s;
  s.add("init/", 1);
  s.set("/a", "x");
  s.queue_push("q", "1");
  EXPECT_EQ(s.num_keys(), 2u);
  EXPECT_TRUE(s.remove("/a"));
  EXPECT_FALSE(s.remove("/a"));
  EXPECT_EQ(s.num_keys(), 1u);
}

TEST(KvStoreTest, QueuePushWakesOneWaiterAndPopIsFifo) {
  TwoWaiters t("q");
  KvStore& s = t.s;
  s.queue_push("q", "first");
  EXPECT_EQ(t.woken(), 1);
  s.queue_push("q", "second");
  EXPECT_EQ(t.woken(), 2);
  EXPECT_TRUE(s.check(t.keys));
  std::string v;
  EXPECT_EQ(s.queue_pop("q", v), 2);
  EXPECT_EQ(v, "first");
  EXPECT_EQ(s.queue_len("q"), 1);
  EXPECT_EQ(s.queue_pop("q", v), 1);
  EXPECT_EQ(v, "second");
  EXPECT_EQ(s.queue_pop("q", v), 0);
  EXPECT_FALSE(s.check(t.keys));
}

TEST(KvStoreTest, WatchersSeeCreateUpdateDelete) {
  KvStore s;
  RecordingWaiter w;
  s.watch(w, "k");
  s.set("k", "1");
  s.add("k", 1);
  s.remove("k");
  ASSERT_EQ(w.events.size(), 3u);
  EXPECT_EQ(w.events[0], std::make_tuple(uint8_t{1}, std::string("k"), std::string(""), std::string("1")));
  EXPECT_EQ(w.events[1], std::make_tuple(uint8_t{0}, std::string("k"), std::string("1"), std::string("2")));
  EXPECT_EQ(w.events[2], std::make_tuple(uint8_t{2}, std::string("k"), std::string("2"), std::string("")));
}

TEST(KvStoreTest, StoredBytesTrackSetsAppendsAndDeletes) {
  KvStore s;
  s.set("ab", "1234");
  s.append("ab", "56");
  EXPECT_EQ(s.stored_bytes(), 8u);
  s.set("ab", "x");
  EXPECT_EQ(s.stored_bytes(), 3u);
  s.remove("ab");
  EXPECT_EQ(s.stored_bytes(), 0u);
}

TEST(KvStoreTest, CancellingSomeOfManyWaitersLeavesExactlyTheOthersToWake) {
  KvStore s;
  std::vector<RecordingWaiter> waiters(1000);
  const std::array<std::string_view, 2> keys{"k", "k"};  // a key twice: both must arrive... the same one
  for (auto& w : waiters) EXPECT_FALSE(s.wait(w, keys));
  for (size_t i = 0; i < waiters.size(); i += 2) EXPECT_TRUE(s.cancel_wait(waiters[i]));
  s.forget(waiters[1]);
  EXPECT_EQ(s.waiting_clients(), 499u);
  s.set("k", "v");
  for (size_t i = 0; i < waiters.size(); ++i) EXPECT_EQ(waiters[i].completed, i % 2 == 1 && i != 1 ? 1 : 0) << i;
  EXPECT_EQ(s.waiting_clients(), 0u);
}

TEST(KvStoreTest, QueuePushWakesTheFirstWaiterStillWaiting) {
  KvStore s;
  RecordingWaiter a, b, c;
  const std::array<std::string_view, 1> q{"q"};
  s.wait(a, q);
  s.wait(b, q);
  s.wait(c, q);
  s.cancel_wait(a);
  s.queue_push("q", "1");
  EXPECT_EQ(a.completed + b.completed + c.completed, 1);
  EXPECT_EQ(b.completed, 1);
  std::string v;
  s.queue_pop("q", v);
  s.queue_push("q", "2");
  EXPECT_EQ(c.completed, 1);
}

TEST(KvStoreTest, PendingWaitsNameTheKeysStillMissing) {
  KvStore s;
  RecordingWaiter w;
  const std::array<std::string_view, 3> keys{"a", "b", "c"};
  s.wait(w, keys);
  s.set("b", "1");
  const auto pending = s.pending_waits();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].waiter, &w);
  EXPECT_EQ(pending[0].missing, (std::vector<std::string>{"a", "c"}));
}

// One job cannot fill the store for the others: each job's keys (under /ddprun/<run id>/) have a
// quota of their own. Before, a client with one job's token filled the store-wide limit and the
// next job failed at once, told only that the store "closed the connection".
TEST(KvStoreTest, EachJobHasAQuotaOfItsOwnAndARefusalLeavesItsReason) {
  StoreLimits limits;
  limits.max_job_keys = 4;
  limits.max_job_bytes = 1000;
  KvStore store(limits);
  for (int i = 0; i < 4; ++i) store.set("/ddprun/greedy/k" + std::to_string(i), "v");
  try {
    store.set("/ddprun/greedy/k4", "v");
    FAIL() << "a fifth key was stored";
  } catch (const LimitError& e) {
    EXPECT_NE(std::string(e.what()).find("job 'greedy' over its quota"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(--job-max-keys)"), std::string::npos) << e.what();
  }
  // The reason is left where the job's agents can read it; it does not count against the job.
  const std::string* note = store.get("/ddprun/greedy/store_refusal");
  ASSERT_NE(note, nullptr);
  EXPECT_NE(note->find("over its quota"), std::string::npos) << *note;
  EXPECT_THROW(store.append("/ddprun/greedy/k0", std::string(2000, 'x')), LimitError);
  EXPECT_THROW(
      store.multi_set(std::array<std::string_view, 1>{"/ddprun/greedy/m"}, std::array<std::string_view, 1>{"v"}),
      LimitError);
  // Another job, and keys outside every job, are not touched by it.
  for (int i = 0; i < 4; ++i) store.set("/ddprun/other/k" + std::to_string(i), "v");
  store.set("/default_pg/0", std::string(2000, 'y'));
  // Deleting frees the job's quota again.
  EXPECT_TRUE(store.remove("/ddprun/greedy/k0"));
  EXPECT_TRUE(store.remove("/ddprun/greedy/store_refusal"));
  store.set("/ddprun/greedy/k4", "v");
}

TEST(KvStoreTest, AFullStoreSaysSoInItsRefusal) {
  StoreLimits limits;
  limits.max_total_keys = 2;
  KvStore store(limits);
  store.set("/ddprun/a/x", "1");
  store.set("/ddprun/a/y", "1");
  try {
    store.compare_set("/ddprun/b/gen", "", "0");
    FAIL() << "a third key was stored";
  } catch (const LimitError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("store full: ", 0), 0u) << e.what();
  }
  const std::string* note = store.get("/ddprun/b/store_refusal");
  ASSERT_NE(note, nullptr);
  EXPECT_NE(note->find("store full"), std::string::npos);
}

}  // namespace
}  // namespace ddprun::rdzv::core
