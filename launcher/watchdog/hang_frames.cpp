// Where a rank is, read from its stacks: the Python frames of the thread that runs the program,
// the native frames of the main thread (eu-stack's or gdb's), which of them are communication and
// which are only waiting (see hang_frames.hpp).
#include "launcher/watchdog/hang_frames.hpp"

#include <algorithm>
#include <sstream>

namespace ddprun::launcher::watchdog {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// Native: the function names of the main thread (its TID is the pid), innermost first.
std::vector<std::string> native_main_functions(const std::string& stack, pid_t pid) {
  std::vector<std::string> out;
  bool in_main = false;
  const std::string eu_header = "TID " + std::to_string(pid) + ":";
  const std::string gdb_marker = "(LWP " + std::to_string(pid) + ")";
  for (const std::string& line : lines_of(stack)) {
    if (line.rfind("TID ", 0) == 0 || line.rfind("Thread ", 0) == 0) {
      in_main = line == eu_header || line.find(gdb_marker) != std::string::npos;
      continue;
    }
    if (!in_main || line.rfind('#', 0) != 0) continue;
    // eu-stack: "#2  0x00007f.. c10d::Work::wait(...)"; gdb: "#2  0x00007f.. in c10d::Work::wait (...) from ..."
    std::istringstream f(line);
    std::string index, word, rest;
    f >> index >> word;
    if (word.rfind("0x", 0) == 0) {
      std::getline(f, rest);
    } else {
      rest = word;  // gdb prints frame #0 without an address at times
      std::string more;
      std::getline(f, more);
      rest += more;
    }
    auto b = rest.find_first_not_of(' ');
    rest = b == std::string::npos ? "" : rest.substr(b);
    if (rest.rfind("in ", 0) == 0) rest = rest.substr(3);
    const auto paren = rest.find(" (");
    if (paren != std::string::npos) rest = rest.substr(0, paren);
    const auto open = rest.find('(');
    if (open != std::string::npos && open > 0) rest = rest.substr(0, open);
    out.push_back(rest.empty() ? "??" : rest);
  }
  return out;
}

namespace {

// Python: the frames ("  File ..." lines, innermost first) of the thread that runs the program
// (its outermost frame is <module>), else of the first thread.
std::vector<std::string> python_main_frames(const std::string& stack) {
  std::vector<std::vector<std::string>> threads;
  for (const std::string& line : lines_of(stack)) {
    if (line.rfind("Thread ", 0) == 0 || line.rfind("Current thread ", 0) == 0) threads.emplace_back();
    else if (line.rfind("  File \"", 0) == 0 && !threads.empty()) threads.back().push_back(line);
  }
  for (const auto& t : threads) {
    if (!t.empty() && t.back().find(" in <module>") != std::string::npos) return t;
  }
  return threads.empty() ? std::vector<std::string>{} : threads.front();
}

// `  File "/a/b/train.py", line 12 in step` -> {"train.py:12", "step", "/a/b/train.py"}
struct PyFrame {
  std::string where, function, path;
};
PyFrame parse_py_frame(const std::string& line) {
  PyFrame f;
  const auto q1 = line.find('"'), q2 = line.find('"', q1 + 1);
  if (q1 == std::string::npos || q2 == std::string::npos) return f;
  f.path = line.substr(q1 + 1, q2 - q1 - 1);
  const auto slash = f.path.rfind('/');
  const std::string base = slash == std::string::npos ? f.path : f.path.substr(slash + 1);
  const auto ln = line.find("line ", q2), in = line.find(" in ", q2);
  std::string number =
      ln == std::string::npos ? "?" : line.substr(ln + 5, (in == std::string::npos ? line.size() : in) - ln - 5);
  f.where = base + ":" + number;
  f.function = in == std::string::npos ? "?" : line.substr(in + 4);
  return f;
}

bool is_comm_function(const std::string& f) {
  return f.find("c10d::") != std::string::npos || f.find("gloo::") != std::string::npos ||
         f.find("nccl") != std::string::npos || f.find("GlooBucketReducer") != std::string::npos;
}

bool is_wait_plumbing(const std::string& f) {
  static const char* kPlumbing[] = {"futex", "poll",    "epoll", "nanosleep", "pthread_cond",
                                    "__GI_", "read",    "recv",  "select",    "clock_nanosleep",
                                    "sleep", "syscall", "??",    "std::"};
  for (const char* p : kPlumbing) {
    if (f.find(p) != std::string::npos) return true;
  }
  return f.rfind("0x", 0) == 0 || f.empty();
}

}  // namespace

bool rank_in_collective(const RankState& r) {
  if (r.in_collective) return true;
  for (const std::string& frame : python_main_frames(r.python_stack)) {
    if (frame.find("/torch/distributed/") != std::string::npos) return true;
  }
  const auto native = native_main_functions(r.native_stack, r.pid);
  return std::any_of(native.begin(), native.end(), is_comm_function);
}

std::string rank_location(const RankState& r) {
  if (r.exited) return "exited";
  const auto py = python_main_frames(r.python_stack);
  if (!py.empty()) {
    // The innermost frame in torch.distributed, called from the program's own code.
    for (size_t i = 0; i < py.size(); ++i) {
      const PyFrame f = parse_py_frame(py[i]);
      if (f.path.find("/torch/distributed/") == std::string::npos) continue;
      std::string caller;
      for (size_t k = i + 1; k < py.size(); ++k) {
        const PyFrame c = parse_py_frame(py[k]);
        if (c.path.find("/torch/") == std::string::npos) {
          caller = c.where;
          break;
        }
      }
      // The outermost torch.distributed frame is the call the program made, less the decorators
      // PyTorch 2.x wraps its collectives in (c10d_logger.py's `wrapper`).
      size_t outer = i;
      while (outer + 1 < py.size() &&
             parse_py_frame(py[outer + 1]).path.find("/torch/distributed/") != std::string::npos) {
        ++outer;
      }
      const auto decorator = [](const PyFrame& frame) {
        return frame.function == "wrapper" || frame.path.find("/torch/distributed/c10d_logger.py") != std::string::npos;
      };
      while (outer > i && decorator(parse_py_frame(py[outer]))) --outer;
      return "in torch.distributed " + parse_py_frame(py[outer]).function + (caller.empty() ? "" : " (" + caller + ")");
    }
    const PyFrame top = parse_py_frame(py.front());
    return "in " + top.function + " (" + top.where + ")";
  }
  const auto native = native_main_functions(r.native_stack, r.pid);
  for (const std::string& f : native) {
    if (is_comm_function(f)) return "in " + f;
  }
  for (const std::string& f : native) {
    if (!is_wait_plumbing(f)) return "in " + f;
  }
  if (!native.empty()) return "in " + native.front();
  return r.wchan.empty() ? r.state : r.state + " in " + r.wchan;
}

}  // namespace ddprun::launcher::watchdog
