#pragma once
// The agent's job page and its data over HTTP (docs/job-views.md):
//   /ui, /ui.js, /ui.css  the page (rendezvous/server/web_page.hpp): self-contained, nothing
//                         fetched from elsewhere
//   /api/job              JobView::snapshot() as JSON
//   /hang_report          the hang report (every rank's stacks), once there is one
//   /metrics              JobView::metrics(), Prometheus' text format
// The page and its data hold what the workers print and the stacks of their threads: they are
// answered to this host alone (a loopback peer; from elsewhere, through `ssh -L`), and only to
// requests addressed to this host by name or address (rendezvous/server/host_check.hpp: no page
// of another site, its name resolved here, reads them). /metrics holds figures only and is
// answered to anyone under any name, as the health endpoint is (Prometheus scrapes by whatever
// name its service discovery has).

#include <optional>

#include "launcher/view/job_view.hpp"
#include "rendezvous/server/host_check.hpp"
#include "rendezvous/server/http_server.hpp"

namespace ddprun::launcher::view {

// The answer to `request` when its path is one of the above; nullopt for any other path.
std::optional<rdzv::server::HttpReply> serve_view(const JobView& view, const rdzv::server::HttpRequest& request,
                                                  const rdzv::server::HostCheck& hosts);

}  // namespace ddprun::launcher::view
