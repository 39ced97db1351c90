#include "launcher/workers/worker_exit.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "common/printable.hpp"
#include "common/system.hpp"
#include "common/unique_fd.hpp"

namespace ddprun::launcher::workers {

int shell_exit_code(const WorkerExit& e) { return e.signal != 0 ? 128 + e.signal : e.exit_code; }

std::string describe_exit(const WorkerExit& e) {
  if (e.signal != 0) return "signal " + std::to_string(e.signal) + " (" + signal_name(e.signal) + ")";
  return "exit code " + std::to_string(e.exit_code);
}

bool lost_a_peer(const WorkerExit& e) {
  static constexpr const char* kSigns[] = {"connection closed by peer", "connection reset by peer", "broken pipe",
                                           "remote process exited",     "ncclremoteerror",          "socket closed"};
  auto says_so = [](std::string text) {
    std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
    return std::any_of(std::begin(kSigns), std::end(kSigns),
                       [&](const char* sign) { return text.find(sign) != std::string::npos; });
  };
  if (e.error_text && says_so(*e.error_text)) return true;
  return std::any_of(e.stderr_tail.begin(), e.stderr_tail.end(), says_so);
}

namespace {

// What is at `path` when it is not a file ddprun reads: a phrase for the warning.
std::string kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string cut_note(size_t at) {
  return "\n(ddprun kept the first " + std::to_string(at / 1024) + " KiB of this error; the rest is in the file)";
}

}  // namespace

void read_error_file(WorkerExit& e) {
  if (e.error_file.empty()) return;
  auto refuse = [&](const std::string& what) {
    log::warn("ddprun") << "rank " << e.rank << "'s error file " << printable_line(e.error_file)
                        << " is not read: " << what
                        << "; a worker writes its error file (TORCHELASTIC_ERROR_FILE) as a regular file";
  };
  // O_NONBLOCK: a FIFO opens at once, writer or not, rather than holding the supervisor in open()
  // until one comes. O_NOFOLLOW: a link at the end (to /dev/zero, to another user's file) is ELOOP.
  const UniqueFd fd(::open(e.error_file.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    if (err == ENOENT) return;  // the worker wrote none
    if (err == ELOOP) return refuse("it is a symbolic link, which ddprun does not follow");
    return refuse(std::string("cannot open it: ") + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return refuse(std::string("cannot stat it: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return refuse("it is " + kind_of(st.st_mode));
  if (st.st_uid != ::geteuid()) return refuse("it is another user's file (uid " + std::to_string(st.st_uid) + ")");
  // One byte past the bound tells a file that is longer from one that fits.
  std::string text;
  char chunk[16384];
  while (text.size() <= kErrorFileLimit) {
    const size_t want = std::min(sizeof chunk, kErrorFileLimit + 1 - text.size());
    const ssize_t n = retry_eintr([&] { return ::read(fd.get(), chunk, want); });
    if (n < 0) return refuse(std::string("cannot read it: ") + std::strerror(errno));
    if (n == 0) break;
    text.append(chunk, static_cast<size_t>(n));
  }
  const bool cut = text.size() > kErrorFileLimit;
  if (cut) text.resize(kErrorFileLimit);
  if (cut) {
    log::warn("ddprun") << "rank " << e.rank << "'s error file " << printable_line(e.error_file) << " is over "
                        << kErrorFileLimit / (size_t{1024} * 1024) << " MiB: ddprun reads its first "
                        << kErrorFileLimit / (size_t{1024} * 1024) << " MiB only";
  }
  e.error_text = error_message(text, cut);
  if (!text.empty()) e.error_document = std::make_shared<const std::string>(std::move(text));
}

std::optional<std::string> error_message(const std::string& text, bool cut) {
  if (text.empty()) return std::nullopt;
  auto bounded = [](std::string out) {
    if (out.size() > kErrorTextLimit) {
      out.resize(kErrorTextLimit);
      out += cut_note(kErrorTextLimit);
    }
    return out;
  };
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return (cut ? "(an error file over " + std::to_string(kErrorFileLimit / (size_t{1024} * 1024)) + " MiB, cut) "
                : "(unparseable error file) ") +
           text.substr(0, 2000);
  }
  std::string out;
  const auto& m = j.is_object() && j.contains("message") ? j["message"] : j;
  if (m.is_string()) {
    out = m.get<std::string>();
  } else if (m.is_object()) {
    if (m.contains("message") && m["message"].is_string()) out = m["message"].get<std::string>();
    if (m.contains("extraInfo") && m["extraInfo"].is_object() && m["extraInfo"].contains("py_callstack") &&
        m["extraInfo"]["py_callstack"].is_string()) {
      out += "\n" + m["extraInfo"]["py_callstack"].get<std::string>();
    }
  }
  if (out.empty()) out = text.substr(0, 2000);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return bounded(std::move(out));
}

void keep_error_text(WorkerExit& e, const std::string& kept_at) { e.error_file = e.error_text ? kept_at : ""; }

}  // namespace ddprun::launcher::workers
