#include "rendezvous/server/state_journal.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "common/replace_file.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "common/unique_fd.hpp"
#include "rendezvous/core/protocol.hpp"

namespace ddprun::rdzv::server {

namespace {

constexpr std::string_view kMagic = "ddprun-state 1\n";
constexpr char kKeyRecord = 'K';
constexpr char kTokenRecord = 'O';
// The changes are folded into a fresh snapshot once they are this much bigger than the last one.
constexpr uint64_t kCompactSlack = uint64_t{64} << 20;
constexpr auto kRetryPeriod = std::chrono::seconds(5);

uint32_t fnv1a(std::string_view data) {
  uint32_t h = 2166136261u;
  for (const char c : data) {
    h ^= static_cast<uint8_t>(c);
    h *= 16777619u;
  }
  return h;
}

// Frames a payload written at `start` of `out` (after a 4-byte placeholder) as a record.
void close_record(std::string& out, size_t start) {
  const std::string_view payload(out.data() + start + 4, out.size() - start - 4);
  const uint32_t checksum = fnv1a(payload);
  std::string len;
  core::put_u32(len, static_cast<uint32_t>(payload.size()));
  out.replace(start, 4, len);
  core::put_u32(out, checksum);
}

// A compare-once token's record: `token` answered `result`.
void append_token_record(std::string& out, std::string_view token, int64_t result) {
  const size_t start = out.size();
  out.append(4, '\0');
  out.push_back(kTokenRecord);
  core::put_bytes(out, token);
  core::put_u64(out, static_cast<uint64_t>(result));
  close_record(out, start);
}

// Reads the fields of one payload; false when it is malformed.
class PayloadReader {
 public:
  explicit PayloadReader(std::string_view p) : p_(p) {}
  bool u8(uint8_t& v) {
    if (pos_ + 1 > p_.size()) return false;
    v = static_cast<uint8_t>(p_[pos_++]);
    return true;
  }
  bool u64(uint64_t& v) {
    if (pos_ + 8 > p_.size()) return false;
    v = core::load_u64(p_.data() + pos_);
    pos_ += 8;
    return true;
  }
  bool str(std::string_view& v) {
    uint64_t n = 0;
    if (!u64(n) || n > p_.size() - pos_) return false;
    v = p_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == p_.size(); }

 private:
  std::string_view p_;
  size_t pos_ = 0;
};

std::string read_file(const std::string& path, bool& exists) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) {
      exists = false;
      return {};
    }
    throw ConfigError("cannot read the state file " + path + ": " + std::strerror(errno));
  }
  exists = true;
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = retry_eintr([&] { return ::read(fd.get(), buf, sizeof buf); });
    if (n < 0) throw ConfigError("cannot read the state file " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  return data;
}

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// What a state file holds: each key's latest value and queue, and the ADD_ONCE tokens, read record
// by record up to the first one that is incomplete or damaged (`end`: the bytes before it).
struct Records {
  struct Entry {
    std::optional<std::string> value;
    std::vector<std::string> items;
  };
  std::unordered_map<std::string, Entry> keys;
  std::vector<std::pair<std::string, int64_t>> tokens;
  size_t end = 0;
};

Records read_records(const std::string& data) {
  Records out;
  size_t pos = kMagic.size();
  while (pos < data.size()) {
    if (data.size() - pos < 8) break;
    const uint32_t len = core::load_u32(data.data() + pos);
    if (len > data.size() - pos - 8) break;
    const std::string_view payload(data.data() + pos + 4, len);
    if (core::load_u32(data.data() + pos + 4 + len) != fnv1a(payload)) break;
    PayloadReader r(payload);
    uint8_t type = 0;
    bool ok = r.u8(type);
    if (ok && type == kKeyRecord) {
      std::string_view key, value;
      uint8_t has_value = 0;
      uint64_t n = 0;
      ok = r.str(key) && r.u8(has_value) && (has_value == 0 || r.str(value)) && r.u64(n);
      Records::Entry e;
      if (has_value) e.value.emplace(value);
      for (uint64_t i = 0; ok && i < n; ++i) {
        std::string_view item;
        ok = r.str(item);
        e.items.emplace_back(item);
      }
      if (ok && r.done()) out.keys[std::string(key)] = std::move(e);
    } else if (ok && type == kTokenRecord) {
      std::string_view token;
      uint64_t result = 0;
      ok = r.str(token) && r.u64(result) && r.done();
      if (ok) out.tokens.emplace_back(token, static_cast<int64_t>(result));
    } else {
      ok = false;
    }
    if (!ok) break;
    pos += 8 + len;
  }
  out.end = pos;
  return out;
}

}  // namespace

StateJournal::StateJournal(std::string path, core::KvStore& store) : path_(std::move(path)), store_(store) {
  const uint64_t valid = load();
  try {
    snapshot();
    return;
  } catch (const std::system_error& e) {
    if (valid == 0) {
      const bool no_dir = e.code() == std::errc::no_such_file_or_directory;
      throw ConfigError("cannot write the state file " + path_ + ": " + e.code().message() +
                        (no_dir ? " (its directory does not exist: create it, e.g. mkdir -p " +
                                      std::filesystem::path(path_).parent_path().string() + ", or give another path)"
                                : " (--state-file needs a writable file on a disk with room for the store's "
                                  "contents)"));
    }
    // No room for a second copy (a full disk): go on appending to the file as it is, after its
    // last complete record.
    log::warn("store") << "cannot rewrite the state file " << path_ << " as a snapshot (" << e.code().message()
                       << "); appending to it as it is";
  }
  fd_.reset(::open(path_.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd_ || ::ftruncate(fd_.get(), static_cast<off_t>(valid)) != 0 || ::lseek(fd_.get(), 0, SEEK_END) < 0) {
    throw ConfigError("cannot write the state file " + path_ + ": " + std::strerror(errno));
  }
  file_bytes_ = snapshot_bytes_ = valid;
}

StateJournal::~StateJournal() { flush(); }

uint64_t StateJournal::load() {
  bool exists = false;
  const std::string data = read_file(path_, exists);
  if (!exists) return 0;
  if (data.size() < kMagic.size() || std::string_view(data).substr(0, kMagic.size()) != kMagic) {
    throw ConfigError("the state file " + path_ + " is not a ddprun-rendezvous state file (it does not start with '" +
                      std::string(kMagic.substr(0, kMagic.size() - 1)) +
                      "'); give --state-file a new path or the file a previous daemon wrote");
  }
  const Records records = read_records(data);
  const size_t pos = records.end;
  loaded_.dropped_bytes = data.size() - pos;
  if (loaded_.dropped_bytes > 0) {
    log::warn("store") << "the state file " << path_ << " ends with " << loaded_.dropped_bytes
                       << " byte(s) that are no complete record (the daemon stopped while writing them); "
                          "loading what comes before";
  }
  // What was stored is restored even where today's limits are lower.
  const core::StoreLimits limits = store_.limits();
  core::StoreLimits none;
  none.max_total_keys = std::numeric_limits<uint64_t>::max();
  none.max_store_bytes = std::numeric_limits<uint64_t>::max();
  store_.set_limits(none);
  for (const auto& [key, e] : records.keys) {
    if (e.value) {
      store_.set(key, *e.value);
      ++loaded_.keys;
    }
    for (const std::string& item : e.items) store_.queue_push(key, item);
    if (!e.items.empty()) ++loaded_.queues;
  }
  store_.set_limits(limits);
  for (const auto& [token, result] : records.tokens) store_.remember_once(token, result);
  loaded_.tokens = records.tokens.size();
  return pos;
}

void StateJournal::append_key_record(std::string& out, std::string_view key) const {
  const size_t start = out.size();
  out.append(4, '\0');
  out.push_back(kKeyRecord);
  core::put_bytes(out, key);
  const std::string* value = store_.get(key);
  core::put_u8(out, value != nullptr ? 1 : 0);
  if (value != nullptr) core::put_bytes(out, *value);
  const std::deque<std::string>* items = store_.queue_items(key);
  core::put_u64(out, items != nullptr ? items->size() : 0);
  if (items != nullptr) {
    for (const std::string& item : *items) core::put_bytes(out, item);
  }
  close_record(out, start);
}

void StateJournal::snapshot() {
  std::string out(kMagic);
  store_.for_each("", [&](std::string_view key, const std::string&) { append_key_record(out, key); });
  store_.for_each_queue([&](std::string_view key, const std::deque<std::string>&) {
    if (store_.get(key) == nullptr) append_key_record(out, key);  // else written with its value
  });
  store_.for_each_once([&](std::string_view token, int64_t result) { append_token_record(out, token, result); });
  if (const auto failed = replace_file(path_, out)) {
    errno = failed->err;
    throw_errno(failed->step);
  }
  UniqueFd appender(::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
  if (!appender) throw_errno("open " + path_);
  fd_ = std::move(appender);
  file_bytes_ = snapshot_bytes_ = out.size();
  // Everything changed so far is in the snapshot.
  dirty_.clear();
  dirty_set_.clear();
  tokens_.clear();
}

void StateJournal::on_change(std::string_view key, const int64_t*) {
  // The key's state is read at flush time: after the change, and once however often it changed.
  if (dirty_set_.find(key) != dirty_set_.end()) return;
  dirty_set_.emplace(key);
  dirty_.emplace_back(key);
}

void StateJournal::on_once(std::string_view token, int64_t result) { append_token_record(tokens_, token, result); }

void StateJournal::flush() {
  if (dirty_.empty() && tokens_.empty()) return;
  if (broken_) {
    // Not written: retry_if_broken() writes a snapshot of everything instead.
    dirty_.clear();
    dirty_set_.clear();
    tokens_.clear();
    return;
  }
  std::string out;
  for (const std::string& key : dirty_) append_key_record(out, key);
  out += tokens_;
  dirty_.clear();
  dirty_set_.clear();
  tokens_.clear();
  if (!write_all(fd_.get(), out)) {
    const int err = errno;
    broken_ = true;
    last_retry_ = std::chrono::steady_clock::now();
    log::error("store") << "cannot write the state file " << path_ << ": " << std::strerror(err)
                        << "; serving on from memory, but a restart now would lose the changes since (trying a "
                           "fresh snapshot every "
                        << kRetryPeriod.count() << " s)";
    return;
  }
  file_bytes_ += out.size();
  if (file_bytes_ > 2 * snapshot_bytes_ + kCompactSlack) {
    try {
      snapshot();
    } catch (const std::system_error& e) {
      // The records are in the file already; only the compaction failed.
      log::warn("store") << "cannot rewrite the state file " << path_ << " as a snapshot: " << e.what();
      snapshot_bytes_ = file_bytes_;  // try again after as much again
    }
  }
}

void StateJournal::retry_if_broken() {
  if (!broken_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_retry_ < kRetryPeriod) return;
  last_retry_ = now;
  try {
    snapshot();
    broken_ = false;
    log::info("store") << "the state file " << path_ << " is written again: it holds every change";
  } catch (const std::system_error&) {
    // Still failing: said once already.
  }
}

}  // namespace ddprun::rdzv::server
