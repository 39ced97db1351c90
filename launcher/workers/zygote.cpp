#include "launcher/workers/zygote.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/system.hpp"

namespace ddprun::launcher::workers {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

UniqueFd unix_listener(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) throw ProcessError("--preload: socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) throw ProcessError(std::string("--preload: socket: ") + std::strerror(errno));
  ::unlink(path.c_str());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd.get(), 1) != 0) {
    throw ProcessError("--preload: cannot listen on " + path + ": " + std::strerror(errno));
  }
  return fd;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<long long>(left, 1000));
}

std::string describe_status(int status) {
  return WIFSIGNALED(status) ? "killed by " + signal_name(WTERMSIG(status))
                             : "exit code " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

Zygote::Zygote(const std::string& python, const std::vector<std::string>& modules, std::vector<std::string> envp,
               const std::string& socket_path, OrphanGuard* guard)
    : socket_path_(socket_path), guard_(guard) {
  listen_fd_ = unix_listener(socket_path_);
  std::string list;
  for (const std::string& m : modules) list += (list.empty() ? "" : ",") + m;
  envp.push_back("DDPRUN_ZYGOTE_SOCKET=" + socket_path_);
  envp.push_back("DDPRUN_ZYGOTE_PRELOAD=" + list);
  SpawnRequest req;
  req.argv = {python, "-u", "-c", zygote_source()};
  req.envp = std::move(envp);
  SpawnedProcess p;
  try {
    p = spawn_process(req);
  } catch (...) {
    listen_fd_.reset();
    ::unlink(socket_path_.c_str());
    throw;
  }
  pid_ = p.pid;
  out_fd_ = std::move(p.stdout_fd);
  err_fd_ = std::move(p.stderr_fd);
  for (int fd : {out_fd_.get(), err_fd_.get()}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (guard_) guard_->watch_group(pid_);
}

Zygote::~Zygote() {
  sock_.reset();  // the zygote's loop ends: it exits
  listen_fd_.reset();
  if (pid_ > 0) {
    bool gone = false;
    for (int i = 0; i < 200 && !gone; ++i) {  // up to 2 s
      const pid_t r = ::waitpid(pid_, nullptr, WNOHANG);
      gone = r == pid_ || (r < 0 && errno == ECHILD);
      if (!gone) ::usleep(10000);
    }
    if (!gone) {
      ::kill(pid_, SIGKILL);
      retry_eintr([&] { return ::waitpid(pid_, nullptr, 0); });
    }
    if (guard_) guard_->forget_group(pid_);
  }
  out_fd_.reset();
  err_fd_.reset();
  ::unlink(socket_path_.c_str());
}

void Zygote::fail(const std::string& why) {
  ready_known_ = true;
  ready_ = false;
  why_ = why;
  sock_.reset();
  listen_fd_.reset();
  if (pid_ > 0) ::kill(pid_, SIGKILL);
}

void Zygote::relay_output(UniqueFd& fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n > 0) {
      pending_out_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) fd.reset();
    break;
  }
  size_t nl;
  while ((nl = pending_out_.find('\n')) != std::string::npos) {
    log::info("ddprun") << "--preload: " << pending_out_.substr(0, nl);
    pending_out_.erase(0, nl + 1);
  }
}

std::string Zygote::receive(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    pollfd p{sock_.get(), POLLIN, 0};
    const int r = retry_eintr([&] { return ::poll(&p, 1, remaining_ms(deadline)); });
    if (r > 0) break;
    if (Clock::now() >= deadline) throw ProcessError("no answer from the zygote within " + seconds_text(timeout));
  }
  std::string msg(1 << 16, '\0');
  const ssize_t n = retry_eintr([&] { return ::recv(sock_.get(), msg.data(), msg.size(), 0); });
  if (n <= 0) throw ProcessError(n == 0 ? "the zygote exited" : std::string("recv: ") + std::strerror(errno));
  msg.resize(static_cast<size_t>(n));
  return msg;
}

bool Zygote::accept_zygote(Clock::time_point deadline, std::chrono::milliseconds timeout) {
  while (!sock_) {
    pollfd fds[3] = {{listen_fd_.get(), POLLIN, 0}, {out_fd_.get(), POLLIN, 0}, {err_fd_.get(), POLLIN, 0}};
    retry_eintr([&] { return ::poll(fds, 3, remaining_ms(deadline)); });
    if (fds[1].revents) relay_output(out_fd_);
    if (fds[2].revents) relay_output(err_fd_);
    if (fds[0].revents & POLLIN) {
      UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      ucred cred{};
      socklen_t len = sizeof cred;
      if (fd && ::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid == pid_) {
        sock_ = std::move(fd);
        listen_fd_.reset();
        ::unlink(socket_path_.c_str());
      }  // else not our zygote (the run directory is private: this should not happen): closed
      continue;
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      fail("the interpreter exited (" + describe_status(status) + ") before it connected");
      return false;
    }
    if (Clock::now() >= deadline) {
      fail("the interpreter did not start within " + seconds_text(timeout));
      return false;
    }
  }
  return true;
}

std::string Zygote::await_answer(Clock::time_point deadline, std::chrono::milliseconds timeout) {
  for (;;) {
    // Import warnings are relayed while the imports run.
    pollfd fds[3] = {{sock_.get(), POLLIN, 0}, {out_fd_.get(), POLLIN, 0}, {err_fd_.get(), POLLIN, 0}};
    retry_eintr([&] { return ::poll(fds, 3, remaining_ms(deadline)); });
    if (fds[1].revents) relay_output(out_fd_);
    if (fds[2].revents) relay_output(err_fd_);
    if (fds[0].revents) break;
    if (Clock::now() >= deadline) throw ProcessError("the imports took longer than " + seconds_text(timeout));
  }
  return receive(std::chrono::seconds(1));
}

void Zygote::drain_output() {
  // What it printed before it went quiet (its stdio is /dev/null now): read to the end, bounded.
  const auto drain_until = Clock::now() + std::chrono::seconds(1);
  while ((out_fd_ || err_fd_) && Clock::now() < drain_until) {
    pollfd fds[2] = {{out_fd_.get(), POLLIN, 0}, {err_fd_.get(), POLLIN, 0}};
    retry_eintr([&] { return ::poll(fds, 2, remaining_ms(drain_until)); });
    if (fds[0].revents) relay_output(out_fd_);
    if (fds[1].revents) relay_output(err_fd_);
  }
  out_fd_.reset();
  err_fd_.reset();
}

bool Zygote::ready(std::chrono::milliseconds timeout) {
  if (ready_known_) return ready_;
  const auto deadline = Clock::now() + timeout;
  if (!accept_zygote(deadline, timeout)) return false;
  json answer;
  try {
    answer = json::parse(await_answer(deadline, timeout), nullptr, false);
  } catch (const ProcessError& e) {
    fail(e.what());
    return false;
  }
  if (!answer.is_object() || !answer.value("ok", false)) {
    fail(answer.is_object() && answer.contains("error") && answer["error"].is_string()
             ? answer["error"].get<std::string>()
             : "the zygote answered " + answer.dump().substr(0, 200));
    return false;
  }
  import_seconds_ = answer.value("seconds", 0.0);
  drain_output();
  ready_known_ = ready_ = true;
  return true;
}

SpawnedProcess Zygote::spawn(const SpawnRequest& req) {
  if (!ready_) throw ProcessError("the zygote is not serving: " + why_);
  Pipe out = make_pipe("the zygote's worker"), err = make_pipe("the zygote's worker");
  int in = STDIN_FILENO;
  UniqueFd devnull;
  if (::fcntl(STDIN_FILENO, F_GETFD) < 0) {
    devnull.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    in = devnull.get();
  }
  char cwd[4096];
  json body = {{"argv", req.argv},
               {"env", req.envp},
               {"cwd", ::getcwd(cwd, sizeof cwd) ? std::string(cwd) : std::string("/")},
               {"cpus", std::vector<int>(req.cpus.begin(), req.cpus.end())},
               {"numa_node", req.preferred_numa_node},
               {"parent", static_cast<int>(::getpid())}};
  const std::string text = body.dump();
  const int fds[3] = {in, out.write.get(), err.write.get()};
  char control[CMSG_SPACE(sizeof fds)] = {};
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  const ssize_t sent = retry_eintr([&] { return ::sendmsg(sock_.get(), &msg, MSG_NOSIGNAL); });
  const int send_errno = errno;
  out.write.reset();  // the worker holds them now
  err.write.reset();
  devnull.reset();
  auto give_up = [&](const std::string& why) {
    ready_ = false;
    why_ = why;
    throw ProcessError(why);
  };
  if (sent != static_cast<ssize_t>(text.size()))
    give_up(std::string("the zygote is gone (") + std::strerror(send_errno) + ")");
  json answer;
  try {
    answer = json::parse(receive(std::chrono::seconds(30)), nullptr, false);
  } catch (const ProcessError& e) {
    give_up(e.what());
  }
  if (!answer.is_object() || !answer.contains("pid") || !answer["pid"].is_number_integer()) {
    throw ProcessError(answer.is_object() && answer.contains("error") && answer["error"].is_string()
                           ? "the zygote could not fork: " + answer["error"].get<std::string>()
                           : "the zygote answered " + answer.dump().substr(0, 200));
  }
  SpawnedProcess p;
  p.pid = answer["pid"].get<int>();
  p.stdout_fd = std::move(out.read);
  p.stderr_fd = std::move(err.read);
  return p;
}

}  // namespace ddprun::launcher::workers
