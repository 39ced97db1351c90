#include "rendezvous/daemon/metrics.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/procfs.hpp"
#include "common/system.hpp"
#include "common/prometheus.hpp"
#include "rendezvous/jobs/job_keys.hpp"

namespace ddprun::rdzv::daemon {

namespace asio = boost::asio;
using prometheus::Exposition;
using prometheus::label;

namespace {

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

}  // namespace

std::string render_metrics(const server::Server& server, const JobStates& jobs) {
  const server::ServerStats st = server.stats();
  const core::KvStore& store = server.store();
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
  for (size_t r = 0; r < server::kCloseReasonCount; ++r) {
    e.sample("ddprun_store_connections_closed_total", st.closed[r],
             label("reason", server::close_reason_name(static_cast<server::CloseReason>(r))));
  }
  e.family("ddprun_store_requests_total", "counter", "Requests served, by operation.");
  for (size_t op = 0; op < core::kOpCount; ++op) {
    e.sample("ddprun_store_requests_total", store.requests(static_cast<core::Op>(op)),
             label("op", core::op_name(static_cast<core::Op>(op))));
  }
  e.single("ddprun_store_turns_total", "counter",
           "Turns served: each reads, applies and answers everything ready when it starts.", st.turns);
  e.single("ddprun_store_ceded_turns_total", "counter",
           "Turns after a wake-up, each begun by letting the threads waiting for the daemon's CPU run first.",
           st.ceded_turns);
  e.single("ddprun_store_received_bytes_total", "counter", "Bytes received from clients.", st.bytes_received);
  e.single("ddprun_store_sent_bytes_total", "counter", "Bytes sent to clients.", st.bytes_sent);
  e.single("ddprun_store_keys", "gauge", "Keys and queues stored.", store.total_keys());
  e.single("ddprun_store_keys_limit", "gauge", "Most keys and queues the store holds (--max-total-keys).",
           store.limits().max_total_keys);
  e.single("ddprun_store_stored_bytes", "gauge", "Bytes of keys and values stored.", store.stored_bytes());
  e.single("ddprun_store_stored_bytes_limit", "gauge", "Most bytes the store holds (--max-store-bytes).",
           store.limits().max_store_bytes);
  e.single("ddprun_store_held_input_bytes", "gauge",
           "Memory of the connections' input buffers: unfinished requests, and requests read that wait for their "
           "client to read its replies.",
           st.held_input_bytes);
  e.single("ddprun_store_held_input_bytes_limit", "gauge",
           "Most memory the input buffers hold together (--max-unfinished-bytes).", st.held_input_limit);
  e.single("ddprun_store_owed_bytes", "gauge",
           "Bytes of replies copied for clients that have not taken them yet (large values are shared, not copied).",
           st.owed_bytes);
  e.single("ddprun_store_owed_bytes_limit", "gauge", "Most bytes the replies owed hold together (--max-owed-bytes).",
           st.owed_limit);
  e.single("ddprun_store_pending_waits", "gauge", "Clients blocked in WAIT for keys that do not exist yet.",
           st.waiting_clients);

  // ddprun jobs, by state (every state listed, so that a dashboard sees zeros too).
  const std::map<std::string, int> by_state = jobs.by_state();
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

MetricsServer::MetricsServer(asio::io_context& io, const std::string& host, uint16_t port,
                             std::function<std::string()> render, Pages pages, server::PeerRateSettings limit)
    : http_(io, host, port, "ddprun-rendezvous",
            [render = std::move(render), pages = std::move(pages),
             limiter = std::make_shared<server::PeerRateLimit>(limit)](const server::HttpRequest& request) {
              if (const auto wait = limiter->admit(request.peer, std::chrono::steady_clock::now())) {
                server::HttpReply busy;
                busy.status = 429;
                busy.headers.emplace_back("Retry-After", std::to_string(*wait));
                busy.body = "too many requests from this address: ask again in " + std::to_string(*wait) + " s\n";
                return busy;
              }
              if (pages) {
                if (auto page = pages(request)) return std::move(*page);
              }
              const std::string_view target = request.target;
              server::HttpReply reply;
              if (target == "/metrics" || target.substr(0, 9) == "/metrics?") {
                reply.content_type = prometheus::kContentType;
                reply.body = render();
              } else if (target == "/") {
                reply.body = pages ? "ddprun-rendezvous: metrics at /metrics, the jobs at /ui\n"
                                   : "ddprun-rendezvous: metrics at /metrics\n";
              } else {
                reply.status = 404;
                reply.body = "not found: try /metrics\n";
              }
              return reply;
            }) {}

MetricsServer::~MetricsServer() = default;

void MetricsServer::start() {
  log::info("store") << "metrics on http://" << server::format_endpoint(http_.local_endpoint())
                     << "/metrics, the jobs at /ui";
  http_.start();
}

void MetricsServer::stop() { http_.stop(); }

}  // namespace ddprun::rdzv::daemon
