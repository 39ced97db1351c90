#include "rendezvous/daemon/metrics.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <sstream>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/procfs.hpp"
#include "rendezvous/core/job_keys.hpp"
#include "rendezvous/daemon/job_summary.hpp"

namespace ddprun::rdzv {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

namespace {

class Exposition {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  template <typename V>
  void sample(const char* name, V value, const std::string& labels = "") {
    out_ << name;
    if (!labels.empty()) out_ << '{' << labels << '}';
    out_ << ' ' << value << '\n';
  }
  template <typename V>
  void single(const char* name, const char* type, const char* help, V value) {
    family(name, type, help);
    sample(name, value);
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

struct ProcessFacts {
  double cpu_seconds = 0;
  double start_time = 0;  // since the epoch
  uint64_t rss_bytes = 0;
  uint64_t virtual_bytes = 0;
  uint64_t open_fds = 0;
  uint64_t max_fds = 0;
};

ProcessFacts process_facts() {
  ProcessFacts p;
  if (const auto st = procfs::read_stat(0)) {
    const double tick = static_cast<double>(procfs::ticks_per_second());
    p.cpu_seconds = static_cast<double>(st->cpu_ticks) / tick;
    p.virtual_bytes = st->virtual_bytes;
    p.rss_bytes = st->rss_pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    // Start time is in ticks since boot; the boot time is in /proc/stat.
    std::ifstream proc_stat("/proc/stat");
    std::string line;
    while (std::getline(proc_stat, line)) {
      if (line.rfind("btime ", 0) == 0) {
        p.start_time = std::stod(line.substr(6)) + static_cast<double>(st->start_ticks) / tick;
      }
    }
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::end(it);
       it.increment(ec)) {
    ++p.open_fds;
  }
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0) p.max_fds = lim.rlim_cur;
  return p;
}

std::string label(const char* key, std::string_view value) { return std::string(key) + "=\"" + std::string(value) + "\""; }

}  // namespace

std::string render_metrics(const Server& server) {
  const ServerStats st = server.stats();
  const KvStore& store = server.store();
  Exposition e;
  e.single("ddprun_store_connections", "gauge", "Client connections open now.", st.connections);
  e.single("ddprun_store_connections_accepted_total", "counter", "Client connections accepted since the start.",
           st.accepted);
  e.family("ddprun_store_connections_refused_total", "counter",
           "Connections closed before a byte was read: out of file descriptors, or a peer address not allowed.");
  e.sample("ddprun_store_connections_refused_total", st.refused_out_of_fds, label("reason", "out_of_fds"));
  e.sample("ddprun_store_connections_refused_total", st.refused_not_allowed, label("reason", "not_allowed"));
  e.family("ddprun_store_connections_closed_total", "counter",
           "Client connections closed, by reason (bad_request and over_limit are closed by the daemon for bad input).");
  for (size_t r = 0; r < kCloseReasonCount; ++r) {
    e.sample("ddprun_store_connections_closed_total", st.closed[r],
             label("reason", close_reason_name(static_cast<CloseReason>(r))));
  }
  e.family("ddprun_store_requests_total", "counter", "Requests served, by operation.");
  for (size_t op = 0; op < kOpCount; ++op) {
    e.sample("ddprun_store_requests_total", store.requests(static_cast<Op>(op)), label("op", op_name(static_cast<Op>(op))));
  }
  e.single("ddprun_store_received_bytes_total", "counter", "Bytes received from clients.", st.bytes_received);
  e.single("ddprun_store_sent_bytes_total", "counter", "Bytes sent to clients.", st.bytes_sent);
  e.single("ddprun_store_keys", "gauge", "Keys and queues stored.", store.total_keys());
  e.single("ddprun_store_keys_limit", "gauge", "Most keys and queues the store holds (--max-total-keys).",
           store.limits().max_total_keys);
  e.single("ddprun_store_stored_bytes", "gauge", "Bytes of keys and values stored.", store.stored_bytes());
  e.single("ddprun_store_stored_bytes_limit", "gauge", "Most bytes the store holds (--max-store-bytes).",
           store.limits().max_store_bytes);
  e.single("ddprun_store_pending_waits", "gauge", "Clients blocked in WAIT for keys that do not exist yet.",
           st.waiting_clients);

  // ddprun jobs, by state (every state listed, so that a dashboard sees zeros too).
  std::vector<std::pair<std::string, std::string>> entries;
  store.for_each(jobs::kRoot, [&](std::string_view k, const std::string& v) { entries.emplace_back(k, v); });
  const auto now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::map<std::string, int> by_state;
  for (const char* s : {"joining", "running", "succeeded", "failed", "stopped", "node_lost", "re-rendezvous", "hung"}) {
    by_state[s] = 0;
  }
  const auto summary = jobs::summarize_jobs(entries, now_ms);
  for (const auto& job : summary["jobs"]) ++by_state[job.value("state", "joining")];
  e.family("ddprun_store_jobs", "gauge", "ddprun jobs (one per run of a job id) known to the store, by state.");
  for (const auto& [state, n] : by_state) e.sample("ddprun_store_jobs", n, label("state", state));
  e.single("ddprun_store_jobs_forgotten_total", "counter",
           "Job runs deleted because every node had left, or after --job-ttl without a change.", st.jobs_forgotten);

  const ProcessFacts p = process_facts();
  e.single("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", p.cpu_seconds);
  e.single("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", p.rss_bytes);
  e.single("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", p.virtual_bytes);
  e.single("process_open_fds", "gauge", "Number of open file descriptors.", p.open_fds);
  e.single("process_max_fds", "gauge", "Maximum number of open file descriptors.", p.max_fds);
  {
    std::ostringstream start;
    start.precision(15);
    start << p.start_time;
    e.single("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
             start.str());
  }
  return e.str();
}

namespace {

// Connections served at once. A scraper sends its request at once and reads the answer at once:
// a connection that does neither within these times is closed, and when all the places are taken
// the one that has waited longest for its request makes room, so slow clients cannot block
// scraping.
constexpr size_t kMaxConnections = 64;
constexpr auto kRequestTime = std::chrono::seconds(3);
constexpr auto kResponseTime = std::chrono::seconds(10);

}  // namespace

class MetricsSession;

// The connections being served, oldest first (shared with them: a session's last handler may run
// after the server is gone).
struct MetricsServer::Sessions {
  std::list<MetricsSession*> list;
  size_t live = 0;  // not yet made to make room
};

// One HTTP exchange: read a request (bounded in size and time), answer it, close.
class MetricsSession : public std::enable_shared_from_this<MetricsSession> {
 public:
  MetricsSession(tcp::socket socket, std::function<std::string()>& render,
                 std::shared_ptr<MetricsServer::Sessions> all)
      : stream_(std::move(socket)), render_(render), all_(std::move(all)) {
    at_ = all_->list.insert(all_->list.end(), this);
    ++all_->live;
  }
  ~MetricsSession() {
    if (reading_) --all_->live;
    all_->list.erase(at_);
  }

  void start() {
    parser_.header_limit(8 * 1024);
    parser_.body_limit(0);
    stream_.expires_after(kRequestTime);
    http::async_read(stream_, buffer_, parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (!ec && self->reading_) self->respond();
    });
  }

  bool reading() const { return reading_; }
  // Closes a connection whose request has not arrived yet, to make room for a newer one.
  void make_room() {
    if (!reading_) return;
    reading_ = false;
    --all_->live;
    stream_.close();
  }

 private:
  void respond() {
    reading_ = false;
    --all_->live;
    const auto& req = parser_.get();
    auto& res = response_;
    res.version(req.version());
    res.keep_alive(false);
    res.set(http::field::server, "ddprun-rendezvous");
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      res.result(http::status::method_not_allowed);
      res.set(http::field::allow, "GET, HEAD");
      res.body() = "only GET\n";
    } else if (req.target() == "/metrics" || req.target().starts_with("/metrics?")) {
      res.result(http::status::ok);
      res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res.body() = render_();
    } else if (req.target() == "/") {
      res.result(http::status::ok);
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      res.body() = "ddprun-rendezvous: metrics at /metrics\n";
    } else {
      res.result(http::status::not_found);
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      res.body() = "not found: try /metrics\n";
    }
    if (req.method() == http::verb::head) {
      res.content_length(res.body().size());
      res.body().clear();
    }
    res.prepare_payload();
    stream_.expires_after(kResponseTime);
    http::async_write(stream_, res, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{8 * 1024};
  http::request_parser<http::empty_body> parser_;
  http::response<http::string_body> response_;
  std::function<std::string()>& render_;
  std::shared_ptr<MetricsServer::Sessions> all_;
  std::list<MetricsSession*>::iterator at_;
  bool reading_ = true;
};

namespace {

void set_cloexec(int fd) { ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC); }

}  // namespace

MetricsServer::MetricsServer(asio::io_context& io, const std::string& host, uint16_t port,
                             std::function<std::string()> render)
    : io_(io), acceptor_(io), render_(std::move(render)), sessions_(std::make_shared<Sessions>()) {
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  if (ec) throw ConnectionError("cannot serve metrics on '" + host + "': not a numeric address");
  const tcp::endpoint ep(addr, port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) set_cloexec(acceptor_.native_handle());
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw ConnectionError("cannot serve metrics on " + format_endpoint(ep) + ": " + ec.message());
  port_ = acceptor_.local_endpoint().port();
}

MetricsServer::~MetricsServer() { stop(); }

void MetricsServer::start() {
  log::info("store") << "metrics on http://" << format_endpoint(acceptor_.local_endpoint()) << "/metrics";
  accept();
}

void MetricsServer::stop() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
}

void MetricsServer::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      set_cloexec(socket.native_handle());
      if (sessions_->live >= kMaxConnections) {
        for (MetricsSession* s : sessions_->list) {
          if (s->reading()) {
            s->make_room();
            break;
          }
        }
      }
      std::make_shared<MetricsSession>(std::move(socket), render_, sessions_)->start();
      accept();
      return;
    }
    // Out of descriptors or the like: try again shortly rather than spin.
    auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(100));
    timer->async_wait([this, timer](boost::system::error_code wec) {
      if (!wec && acceptor_.is_open()) accept();
    });
  });
}

}  // namespace ddprun::rdzv
