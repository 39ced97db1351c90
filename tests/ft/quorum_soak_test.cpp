// The quorum protocol under random fault schedules: replica groups that train a model of one number
// per step through the real Coordinator on a real ddprun store, while a schedule kills groups
// (their workers restart from nothing), freezes their workers (the agent heartbeats on, nobody
// asks) and freezes their agents (no heartbeat either), each continued later with what it had.
// Every schedule keeps a commit log; after it, the property: no step is ever committed under two
// memberships, and every group that committed a step holds the same state after it.
//
// A group here is a thread per incarnation and the agent's Coordinator; what its workers do between
// quorums is modelled: the state is (step, hash); a healing group takes its source's state as the
// source offered it at that quorum; a step commits when every member of the quorum reached the
// step's collective (a barrier per quorum), and its new hash mixes the state, the quorum and the
// groups whose gradients count, so two commits of one step under different memberships differ.
// Bounded: a fixed number of schedules, each of at most a few seconds, several at a time.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "common/errors.hpp"
#include "launcher/ft/coordinator.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/server/server.hpp"

namespace ddprun::launcher::ft {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr int kSchedules = 200;
constexpr int kParallel = 10;
constexpr int kGroups = 3;
constexpr int64_t kSteps = 8;
constexpr auto kScheduleBound = std::chrono::seconds(6);
constexpr int kMaxFaults = 6;

struct State {
  int64_t step = 0;
  uint64_t hash = 0x9e3779b97f4a7c15ULL;  // every group starts from the same parameters
};

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

struct Commit {
  int group = 0;
  std::string incarnation;
  int64_t step = 0;
  int64_t seq = 0;
  std::set<int> members;
  uint64_t hash = 0;
};

// One schedule's shared facts: what each member offered at a quorum, who reached each quorum's
// collective, the commit log.
struct Job {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::pair<int64_t, int>, State> offered;
  std::map<int64_t, std::set<int>> arrived;
  // A quorum's collective completed (every member arrived) or broke (a member waited in vain): a
  // member that arrives after it broke fails too, as in Gloo, whose peers have left.
  std::map<int64_t, bool> completed;
  std::vector<Commit> log;
};

// A fault point's verdict for the group's thread.
enum class Fate { Go, Die };

// One replica group: its Coordinator (the agent) and the thread of its current incarnation (its
// workers).
class Group {
 public:
  Group(Job& job, int group, std::function<std::unique_ptr<Coordinator>(int)> make)
      : job_(job), group_(group), make_(std::move(make)) {
    coordinator_ = make_(group_);
    start();
  }
  ~Group() { stop(); }

  // SIGKILL of the workers: the agent withdraws the group and starts new workers from nothing
  // (unless they have ended: a finished group's ddprun is gone).
  void kill() {
    if (ended_) return;
    stop();
    coordinator_->withdraw();
    start();
  }
  // SIGSTOP of the workers (the agent heartbeats on) or of the agent too, until resume().
  void freeze(bool agent) {
    std::lock_guard lock(mutex_);
    frozen_ = true;
    if (agent) agent_frozen_ = true;
  }
  void resume() {
    {
      std::lock_guard lock(mutex_);
      frozen_ = false;
    }
    cv_.notify_all();
  }
  void stop() {
    done_ = true;
    if (stop_) stop_->request(SIGTERM);
    resume();
    if (thread_.joinable()) thread_.join();
  }
  int64_t step() const { return step_; }
  // Its workers trained every step, or learnt that the job was over.
  bool ended() const { return ended_; }

 private:
  void start() {
    stop_ = std::make_unique<StopSignal>();
    done_ = false;
    incarnation_ = "i" + std::to_string(++incarnations_);
    coordinator_->set_incarnation(incarnation_);
    thread_ = std::thread([this] { run(); });
  }

  // Where a fault takes effect. A frozen agent stops heartbeating: its Coordinator is dropped
  // without a word and made again, with the same incarnation, when it continues.
  Fate point() {
    std::unique_lock lock(mutex_);
    if (frozen_ && agent_frozen_) {
      coordinator_.reset();
      cv_.wait(lock, [this] { return !frozen_ || done_.load(); });
      agent_frozen_ = false;
      coordinator_ = make_(group_);
      coordinator_->set_incarnation(incarnation_);
    }
    cv_.wait(lock, [this] { return !frozen_ || done_.load(); });
    return done_ ? Fate::Die : Fate::Go;
  }

  void run() {
    State s;
    step_ = 0;
    bool last_ok = true;
    while (s.step < kSteps) {
      if (point() == Fate::Die) return;
      Member self;
      self.step = s.step;
      self.store = "127.0.0.1:1";
      self.recovery = {"127.0.0.1:2"};
      self.pg_ok = last_ok;
      Quorum q;
      try {
        q = coordinator_->next(self, *stop_, milliseconds(1500));
      } catch (const StopRequested&) {
        return;
      } catch (const JobFinished&) {
        ended_ = true;  // nobody left to heal from: the workers exit 0, and so does ddprun
        coordinator_->withdraw();
        return;
      } catch (const Error&) {
        continue;  // no quorum in time (too few groups): ask again
      }
      const GroupView v = view_of(q, group_);
      {
        std::lock_guard lock(job_.mutex);
        job_.offered[{q.seq, group_}] = s;
      }
      job_.cv.notify_all();
      std::this_thread::sleep_for(milliseconds(10));  // sleep override: the forward and backward
      if (point() == Fate::Die) return;
      bool ok = true;
      if (v.heal) {
        std::unique_lock lock(job_.mutex);
        const auto key = std::make_pair(q.seq, v.recover_from);
        ok = job_.cv.wait_for(lock, milliseconds(300), [&] { return job_.offered.count(key) > 0; });
        if (ok) s = job_.offered.at(key);
      }
      if (point() == Fate::Die) return;
      // The step's collective: it completes when every member reached it in time.
      std::set<int> members;
      for (const Member& m : q.members) members.insert(m.group);
      {
        std::unique_lock lock(job_.mutex);
        if (ok && !job_.completed.count(q.seq)) {
          job_.arrived[q.seq].insert(group_);
          if (job_.arrived[q.seq] == members) job_.completed[q.seq] = true;
          job_.cv.wait_for(lock, milliseconds(300), [&] { return job_.completed.count(q.seq) > 0; });
          if (!job_.completed.count(q.seq)) job_.completed[q.seq] = false;  // broken for everyone
        }
        ok = ok && job_.completed.count(q.seq) && job_.completed.at(q.seq);
      }
      job_.cv.notify_all();
      // Frozen here, a group commits when it continues (its collective completed).
      if (point() == Fate::Die) return;
      last_ok = ok;
      if (!ok) continue;
      std::set<int> participants;
      for (const Member& m : q.members)
        if (m.step == v.max_step) participants.insert(m.group);
      uint64_t h = mix(s.hash, static_cast<uint64_t>(q.seq));
      for (int g : participants) h = mix(h, static_cast<uint64_t>(g));
      s = State{v.max_step + 1, h};
      step_ = s.step;
      std::lock_guard lock(job_.mutex);
      job_.log.push_back(Commit{group_, incarnation_, s.step, q.seq, members, s.hash});
    }
    // Every worker exited 0: the agent records the job's end and leaves.
    coordinator_->finish(s.step);
    coordinator_->withdraw();
    ended_ = true;
  }

  Job& job_;
  const int group_;
  std::function<std::unique_ptr<Coordinator>(int)> make_;
  std::unique_ptr<Coordinator> coordinator_;
  std::string incarnation_;
  int incarnations_ = 0;
  std::unique_ptr<StopSignal> stop_;  // a new one for each incarnation
  std::atomic<bool> done_{false};
  std::atomic<int64_t> step_{0};
  std::atomic<bool> ended_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool frozen_ = false;
  bool agent_frozen_ = false;
  std::thread thread_;
};

struct Outcome {
  std::vector<Commit> log;
  std::string schedule;  // what was done, for a failure's message
  bool finished = false;
};

Outcome run_schedule(uint16_t port, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  const int min_groups = 1 + static_cast<int>(rng() % 2);
  Job job;
  auto make = [port, n, min_groups](int g) {
    auto kv = [port] {
      rdzv::client::ClientOptions co;
      co.host = "127.0.0.1";
      co.port = port;
      co.timeout = std::chrono::seconds(10);
      return std::make_unique<StoreQuorumKv>(std::make_unique<rdzv::client::Client>(co));
    };
    CoordinatorOptions o;
    o.run_id = "soak" + std::to_string(n);
    o.group = g;
    o.rules.min_groups = min_groups;
    o.rules.join_timeout = milliseconds(150);
    o.heartbeat_interval = milliseconds(30);
    o.heartbeat_timeout = milliseconds(300);
    o.poll = milliseconds(10);
    o.progress_interval = std::chrono::hours(1);
    return std::make_unique<Coordinator>(o, kv(), kv());
  };
  Outcome out;
  std::ostringstream said;
  said << "schedule " << n << " (seed " << seed << ", min groups " << min_groups << "):";
  std::vector<std::unique_ptr<Group>> groups;
  for (int g = 0; g < kGroups; ++g) groups.push_back(std::make_unique<Group>(job, g, make));
  const auto start = Clock::now();
  auto all_done = [&] {
    for (const auto& g : groups)
      if (!g->ended()) return false;
    return true;
  };
  int faults = 0;
  // One schedule in ten loses every group at once (every node of the job crashed): nobody holds
  // the state any more, and the groups must not train its steps again from nothing; given a second
  // to do so, they wait for a group that holds it.
  const bool lose_all = n % 10 == 0;
  const auto lose_at = start + milliseconds(30 + rng() % 100);
  while (Clock::now() - start < kScheduleBound && !all_done()) {
    if (lose_all && Clock::now() >= lose_at && !all_done()) {
      for (auto& g : groups) g->kill();
      said << " kill every group;";
      std::this_thread::sleep_for(std::chrono::seconds(1));  // sleep override: time to commit twice
      break;
    }
    std::this_thread::sleep_for(milliseconds(lose_all ? 10 : 40 + rng() % 120));  // sleep override: the pace
    if (faults >= kMaxFaults) continue;
    const int g = static_cast<int>(rng() % kGroups);
    switch (rng() % 5) {
      case 0:
      case 1:
        groups[g]->kill();
        said << " kill " << g << ";";
        ++faults;
        break;
      case 2:
      case 3: {
        const bool agent = rng() % 2 == 0;
        groups[g]->freeze(agent);
        const auto hold = milliseconds(100 + rng() % 600);
        std::this_thread::sleep_for(hold);  // sleep override: how long the group stays frozen
        groups[g]->resume();
        said << " freeze " << (agent ? "agent " : "workers ") << g << " " << hold.count() << " ms;";
        ++faults;
        break;
      }
      default: break;
    }
  }
  out.finished = all_done();
  groups.clear();
  out.log = std::move(job.log);
  out.schedule = said.str();
  return out;
}

TEST(QuorumSoakTest, NoStepIsEverCommittedUnderTwoMembershipsAcrossRandomFaultSchedules) {
  rdzv::server::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.log_lifecycle = false;
  rdzv::server::ServerThread server(so);
  std::random_device entropy;
  const uint32_t base = entropy();
  std::cout << "schedules seeded from " << base << std::endl;
  std::vector<Outcome> outcomes(kSchedules);
  for (int first = 0; first < kSchedules; first += kParallel) {
    std::vector<std::thread> batch;
    for (int n = first; n < std::min(first + kParallel, kSchedules); ++n)
      batch.emplace_back([&, n] { outcomes[n] = run_schedule(server.port(), n, base + static_cast<uint32_t>(n)); });
    for (auto& t : batch) t.join();
  }
  int finished = 0;
  size_t commits = 0;
  const auto failures = [] {
    return ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
  };
  for (const Outcome& o : outcomes) {
    const int failed_before = failures();
    finished += o.finished;
    commits += o.log.size();
    std::map<int64_t, const Commit*> first_of;
    std::map<std::pair<int, std::string>, int64_t> last_of;
    for (const Commit& c : o.log) {
      auto [it, fresh] = first_of.emplace(c.step, &c);
      if (!fresh) {
        EXPECT_EQ(c.seq, it->second->seq)
            << o.schedule << " step " << c.step << " committed by group " << c.group << " under quorum " << c.seq
            << " and by group " << it->second->group << " under quorum " << it->second->seq;
        EXPECT_EQ(c.hash, it->second->hash) << o.schedule << " step " << c.step << ": groups " << c.group << " and "
                                            << it->second->group << " hold different states";
      }
      // One incarnation commits each step once, in order.
      auto& last = last_of[{c.group, c.incarnation}];
      EXPECT_GT(c.step, last) << o.schedule << " group " << c.group << " committed step " << c.step << " after "
                              << last;
      last = c.step;
    }
    if (failures() == failed_before) continue;
    std::cout << o.schedule << " committed:\n";  // the whole log of a schedule that broke the property
    for (const Commit& c : o.log) {
      std::cout << "  group " << c.group << " " << c.incarnation << " step " << c.step << " quorum " << c.seq << " {";
      for (int m : c.members) std::cout << " " << m;
      std::cout << " } state " << std::hex << c.hash << std::dec << "\n";
    }
  }
  std::cout << kSchedules << " schedules, " << finished << " ended in every group (all " << kSteps
            << " steps trained, or told that the job was over), " << commits << " commits checked" << std::endl;
  // Not a vacuous soak: the groups trained through most schedules (typically 190 of 200 end within
  // their bound and 4,200 steps commit; those that lost every group wait, as they must). Loose
  // bounds: a loaded machine delays heartbeats, and groups then wait more.
  EXPECT_GT(finished, kSchedules / 4);
  EXPECT_GT(commits, static_cast<size_t>(kSchedules) * 5);
}

}  // namespace
}  // namespace ddprun::launcher::ft
