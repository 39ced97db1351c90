// ddprun-top: a running job in a terminal, from its ddprun's HTTP server (--http_port): the ranks
// in the order the others wait for them, refreshed every --interval seconds (docs/job-views.md).
#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "common/job_pages.hpp"
#include "common/numbers.hpp"
#include "launcher/top/top_fetch.hpp"
#include "launcher/top/top_table.hpp"

namespace {

constexpr const char* kUsage =
    "usage: ddprun-top [--once] [--interval SECONDS] [TARGET]\n"
    "Shows a running ddprun job (started with --http_port) as a table of its ranks, those the others\n"
    "wait for first, refreshed every --interval seconds (default 2); plain lines when stdout is not a\n"
    "terminal. TARGET: HOST:PORT or PORT of the job's ddprun, or the run id (--rdzv_id) of a job of\n"
    "yours on this host; without it, the one job of yours running here.\n"
    "  --once               print one table and exit\n"
    "  --interval SECONDS   refresh every SECONDS (0.2 to 3600; default 2)\n"
    "  --version            print ddprun-top's version and exit\n"
    "Exit codes: 0 shown (or the job ended while shown), 1 no job to show, 2 a bad command line.\n";

struct Target {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string text() const {
    return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
};

[[noreturn]] void fail(const std::string& message, int code) {
  std::cerr << "ddprun-top: " << message << "\n";
  std::exit(code);
}

std::optional<uint16_t> port_of(const std::string& text) {
  const auto v = ddprun::to_int(text);
  if (!v || *v < 1 || *v > 65535) return std::nullopt;
  return static_cast<uint16_t>(*v);
}

std::string jobs_here(const std::vector<ddprun::job_pages::Entry>& jobs) {
  std::string out;
  for (const auto& j : jobs) {
    out += "\n  run id " + j.run_id + ", port " + std::to_string(j.port) + ", pid " + std::to_string(j.pid) + ": " +
           j.program;
  }
  return out;
}

Target resolve(const std::string& spec) {
  Target t;
  if (spec.empty()) {
    const auto jobs = ddprun::job_pages::list();
    if (jobs.empty()) {
      fail(
          "no job of yours with a page runs on this host (start ddprun with --http_port PORT, or name the job's "
          "HOST:PORT)",
          1);
    }
    if (jobs.size() > 1) fail("several jobs of yours run here; name one by its run id or port:" + jobs_here(jobs), 1);
    t.port = jobs.front().port;
    return t;
  }
  if (const auto p = port_of(spec)) {
    t.port = *p;
    return t;
  }
  const auto colon = spec.rfind(':');
  if (colon != std::string::npos && colon + 1 < spec.size()) {
    if (const auto p = port_of(spec.substr(colon + 1))) {
      t.host = spec.substr(0, colon);
      if (t.host.size() > 2 && t.host.front() == '[' && t.host.back() == ']')
        t.host = t.host.substr(1, t.host.size() - 2);
      if (t.host.empty()) fail("'" + spec + "': no host before the port (HOST:PORT, e.g. localhost:8080)", 2);
      t.port = *p;
      return t;
    }
    if (spec.find_first_of("[]") != std::string::npos || spec.find('.') != std::string::npos) {
      fail("'" + spec + "': the port is not a number from 1 to 65535 (HOST:PORT, e.g. localhost:8080)", 2);
    }
  }
  std::vector<ddprun::job_pages::Entry> matching;
  const auto jobs = ddprun::job_pages::list();
  // A replica group's page is advertised under its group's run id (JOB.rgN, as its ddprun's log
  // names it): JOB stands for each of them.
  const auto of_job = [&](const std::string& run_id) {
    const std::string prefix = spec + ".rg";
    return run_id.size() > prefix.size() && run_id.compare(0, prefix.size(), prefix) == 0 &&
           run_id.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
  };
  for (const auto& j : jobs) {
    if (j.run_id == spec || of_job(j.run_id)) matching.push_back(j);
  }
  if (matching.empty()) {
    fail("no job of yours with run id '" + spec + "' and a page runs on this host" +
             (jobs.empty() ? std::string(" (none does: start ddprun with --http_port)")
                           : "; these do:" + jobs_here(jobs)),
         1);
  }
  if (matching.size() > 1)
    fail("several jobs run with run id '" + spec +
             "'; name one by its port (or a replica group by its run id):" + jobs_here(matching),
         1);
  t.port = matching.front().port;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  bool once = false;
  double interval = 2.0;
  std::string spec;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (a == "--version") {
      std::cout << "ddprun-top " << DDPRUN_VERSION << "\n";
      return 0;
    }
    if (a == "--once") {
      once = true;
    } else if (a == "--interval" || a.rfind("--interval=", 0) == 0) {
      std::string v = a == "--interval" ? (i + 1 < argc ? argv[++i] : "") : a.substr(11);
      const auto d = ddprun::to_double(v);
      if (!d || !(*d >= 0.2 && *d <= 3600)) fail("--interval: expected seconds from 0.2 to 3600, got '" + v + "'", 2);
      interval = *d;
    } else if (a.rfind('-', 0) == 0) {
      fail("unknown option '" + a + "'\n" + kUsage, 2);
    } else if (spec.empty()) {
      spec = a;
    } else {
      fail("one TARGET only, got '" + spec + "' and '" + a + "'\n" + kUsage, 2);
    }
  }
  const Target target = resolve(spec);
  const bool tty = ::isatty(STDOUT_FILENO) == 1 && !once;
  bool seen = false;
  for (;;) {
    std::string why;
    const auto snapshot = ddprun::launcher::top::fetch_job_view(target.host, target.port, why);
    if (!snapshot) {
      if (seen) {
        std::cout << "ddprun-top: the job's ddprun at " << target.text() << " no longer answers (" << why
                  << "): the job ended" << std::endl;
        return 0;
      }
      fail("no job view from " + target.text() + ": " + why +
               (why.find("refused") != std::string::npos ? " (is the job running with --http_port?)" : ""),
           1);
    }
    seen = true;
    int width = 0, height = 0;
    if (tty) {
      winsize ws{};
      if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) {
        width = ws.ws_col;
        height = ws.ws_row - 1;
      }
    }
    const std::string table = ddprun::launcher::top::format_table(*snapshot, target.text(), width, height);
    if (tty) {
      std::cout << "\x1b[H\x1b[2J" << table << std::flush;  // home, clear, draw
    } else {
      std::cout << table << std::flush;
    }
    if (once) return 0;
    if (!tty) std::cout << "\n";
    std::this_thread::sleep_for(std::chrono::duration<double>(interval));
  }
}
