#include "common/job_pages.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/replace_file.hpp"

namespace ddprun::job_pages {

namespace fs = std::filesystem;

namespace {

bool alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

}  // namespace

std::string directory() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  std::string dir = runtime && *runtime && fs::is_directory(runtime)
                        ? std::string(runtime) + "/ddprun-pages"
                        : "/tmp/ddprun-pages-" + std::to_string(::getuid());
  ::mkdir(dir.c_str(), 0700);  // (an existing one is checked below)
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 0077) != 0) {
    return "";
  }
  return dir;
}

std::string publish(uint16_t port, const std::string& run_id, const std::string& program) {
  const std::string dir = directory();
  if (dir.empty()) return "";
  std::string file = dir + "/" + std::to_string(::getpid()) + ".json";
  const std::string record =
      nlohmann::json{{"pid", ::getpid()}, {"port", port}, {"run_id", run_id}, {"program", program}}.dump(
          -1, ' ', false, nlohmann::json::error_handler_t::replace) +
      "\n";
  ReplaceFile how;
  how.durability = Durability::Atomic;
  if (replace_file(file, record, how)) return "";
  return file;
}

std::vector<Entry> list() {
  std::vector<Entry> out;
  const std::string dir = directory();
  if (dir.empty()) return out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    if (f.path().extension() != ".json") continue;
    std::ifstream in(f.path());
    std::stringstream text;
    text << in.rdbuf();
    const auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("pid") || !j["pid"].is_number_integer() || !j.contains("port") ||
        !j["port"].is_number_unsigned()) {
      continue;
    }
    Entry e;
    e.pid = j["pid"].get<pid_t>();
    e.port = j["port"].get<uint16_t>();
    e.run_id = j.value("run_id", "");
    e.program = j.value("program", "");
    if (!alive(e.pid)) {
      fs::remove(f.path(), ec);
      continue;
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.pid < b.pid; });
  return out;
}

}  // namespace ddprun::job_pages
