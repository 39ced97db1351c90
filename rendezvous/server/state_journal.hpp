#pragma once
// ddprun-rendezvous --state-file: the store's contents kept across restarts of the daemon, so that
// killing it (even with SIGKILL) and starting it again on the same file ends no running job.
//
// One file: a snapshot of every key, queue and ADD_ONCE token, then a record of each change since,
// each record with its length and a checksum:
//   "ddprun-state 1\n" { u32 length | payload | u32 FNV-1a(payload) } ...
//   payload 'K': str key | u8 has value | [str value] | u64 n | n x str item   (a key's whole state)
//   payload 'O': str token | i64 result                                        (an ADD_ONCE token)
// The server flushes the records of every change before it sends any reply or wake-up
// (Server::send): whatever a client was told has happened is in the file when the client hears it,
// and a daemon started again on the file answers as the one that died. Records go to the page cache
// without fsync: the file outlives the daemon's process, not a crash of its machine (snapshots are
// fsynced). On start the file is read, a torn last record (the daemon died mid-write) is dropped
// with a warning, and the file is rewritten as a fresh snapshot; it is rewritten again whenever
// the changes outgrow the snapshot.
//
// A write that fails (a full disk) is logged once with the path and the reason; the daemon serves
// on from memory (a restart would then lose what changed since) and tries a fresh snapshot every
// few seconds until one succeeds, which it also logs.

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/unique_fd.hpp"
#include "rendezvous/core/kv_store.hpp"

namespace ddprun::rdzv::server {

class StateJournal final : public core::ChangeObserver {
 public:
  struct Loaded {
    size_t keys = 0;
    size_t queues = 0;
    size_t tokens = 0;
    uint64_t dropped_bytes = 0;  // a torn or damaged tail, not loaded
  };

  // Loads `path` (when it exists) into `store`, which must be empty, and rewrites the file as a
  // snapshot (on a disk without room for that, appends to it as it is). Throws ConfigError naming the path if it cannot be read or written, or holds
  // something other than a state file.
  StateJournal(std::string path, core::KvStore& store);
  ~StateJournal() override;
  StateJournal(const StateJournal&) = delete;
  StateJournal& operator=(const StateJournal&) = delete;

  const Loaded& loaded() const { return loaded_; }
  const std::string& path() const { return path_; }
  // Whether every change so far is in the file.
  bool healthy() const { return !broken_; }
  // Writes the records of the changes since the last flush. Never throws.
  void flush();
  // After a failed write: tries a fresh snapshot (at most every few seconds). Never throws.
  void retry_if_broken();

  void on_change(std::string_view key, const int64_t* counter) override;
  void on_once(std::string_view token, int64_t result) override;

 private:
  // Reads the file into the store; returns the length of its complete records (0: no file).
  uint64_t load();
  // Writes every key, queue and token to a new file and renames it over the old one; throws
  // std::system_error on failure (the old file stays as it was).
  void snapshot();
  void append_key_record(std::string& out, std::string_view key) const;

  std::string path_;
  core::KvStore& store_;
  UniqueFd fd_;
  Loaded loaded_;
  std::vector<std::string> dirty_;  // keys changed since the last flush, in order
  std::unordered_set<std::string, core::StringHash, std::equal_to<>> dirty_set_;
  std::string tokens_;  // 'O' records not flushed yet
  uint64_t file_bytes_ = 0;
  uint64_t snapshot_bytes_ = 0;
  bool broken_ = false;
  std::chrono::steady_clock::time_point last_retry_{};
};

}  // namespace ddprun::rdzv::server
