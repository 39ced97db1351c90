// ddprun's job page: renders /api/job ("ddprun-job-view/1", docs/job-views.md) and polls it; on the
// daemon, /ui without a job is the list of its jobs ("ddprun-jobs/1", /api/jobs), each a link to
// its page (ui?job=RUN_ID, whose query the page passes on to api/job).
// Self-contained: no request leaves for any host but the one that served the page (the server's
// Content-Security-Policy says so too). Every text from the job (stderr lines, commands) goes into
// the page as text, never as markup.
(function () {
  "use strict";
  var REFRESH_MS = 1500;
  var state = { last: null, lastOk: 0, failures: 0, refreshes: 0, list: false };

  function $(id) { return document.getElementById(id); }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); }
  function fmtSeconds(s) {
    if (s === null || s === undefined) return "";
    if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.floor(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }
  function fmtMs(ms) { return ms === null || ms === undefined ? "" : ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : ms.toFixed(1) + " ms"; }
  function clock(ms) { var d = new Date(ms); return d.toLocaleTimeString([], { hour12: false }); }

  // A rank's state in words, and the class that colours it.
  function rankState(r) {
    if (!r.alive) return ["exited", "dead"];
    if (r.straggler) return ["straggler", "straggler"];
    if (r.idle_s >= 30) return ["no progress for " + fmtSeconds(r.idle_s), "stalled"];
    if (r.waiting) return ["waiting on the others", "waiting"];
    return ["computing", "computing"];
  }

  function renderHeader(j) {
    $("run-id").textContent = j.run_id && j.run_id !== "none" ? "job " + j.run_id : "";
    var facts = $("facts");
    clear(facts);
    var phase = el("span", { class: "badge" + (j.phase.ok ? (j.phase.name === "restarting" || j.phase.name === "stopping" ? " warn" : "") : " bad") }, j.phase.name);
    facts.appendChild(phase);
    facts.appendChild(document.createTextNode(" " + j.phase.detail + " (" + fmtSeconds(j.phase.seconds) + ")"));
    var bits = [];
    bits.push("round " + j.round);
    bits.push(j.restarts + " restart" + (j.restarts === 1 ? "" : "s"));
    bits.push(j.workers_alive + " of " + j.ranks_here + " worker" + (j.ranks_here === 1 ? "" : "s") + " alive");
    if (j.world_size) bits.push("world size " + j.world_size);
    if (j.source === "daemon") bits.push("from the store, as each node publishes every " + fmtSeconds(j.publish_period_s));
    else if (j.nodes > 1 && j.node >= 0) bits.push("node " + j.node + " of " + j.nodes + " (" + j.host + ")");
    else bits.push(j.host);  // one node, or one without a place yet (joining, a spare)
    if (j.stragglers) bits.push(j.stragglers + " straggler" + (j.stragglers === 1 ? "" : "s"));
    facts.appendChild(el("span", { class: "more" }, " · " + bits.join(" · ")));
    if (j.source === "daemon") {
      facts.appendChild(document.createTextNode(" · "));
      facts.appendChild(el("a", { href: "ui" }, "every job on this store"));
    }
    document.title = "ddprun " + (j.run_id || "") + ": " + j.phase.name;
  }

  function renderRanks(j) {
    var box = $("ranks");
    clear(box);
    j.ranks.slice().sort(function (a, b) { return a.rank - b.rank; }).forEach(function (r) {
      var st = rankState(r);
      var cell = el("div", {
        class: "rank " + st[1], "data-rank": r.rank, "data-straggler": r.straggler ? "true" : "false",
        "data-state": st[1], title: "rank " + r.rank + " (pid " + r.pid + "): " + st[0]
      });
      cell.appendChild(el("b", null, "rank " + r.rank));
      cell.appendChild(el("span", null, "step " + r.step));
      cell.appendChild(el("br"));
      cell.appendChild(el("span", null, r.step_ms !== null ? fmtMs(r.step_ms) : st[0]));
      box.appendChild(cell);
    });
    var note = j.source === "daemon" ? "every node's ranks" : j.nodes > 1 ? "this node's ranks" : "";
    if (j.ranks_not_listed > 0) note += (note ? "; " : "") + j.ranks_not_listed + " more not listed (those the others wait for are)";
    $("ranks-note").textContent = note;
  }

  function renderTable(j) {
    var body = $("table").tBodies[0];
    clear(body);
    j.ranks.forEach(function (r) {
      var st = rankState(r);
      var tr = el("tr", { class: r.straggler ? "straggler" : "", "data-row-rank": r.rank });
      [r.rank, r.node < 0 ? 0 : r.node, r.step, fmtMs(r.step_ms), r.steps_per_s === null ? "" : r.steps_per_s.toFixed(2),
        fmtSeconds(r.idle_s), st[0]].forEach(function (v) { tr.appendChild(el("td", null, v)); });
      body.appendChild(tr);
    });
  }

  function colour(v, median) {
    if (v === null) return "#e5e7eb";
    var x = median > 0 ? v / median : 1;              // 1: the median rank
    var t = Math.max(0, Math.min(1, (x - 1) / 2));     // green at the median, red at 3x it
    return "hsl(" + Math.round(130 * (1 - t)) + ", " + (55 + 20 * t) + "%, " + (55 - 5 * t) + "%)";
  }

  function renderHeat(j) {
    var h = j.heat, canvas = $("heat");
    var rows = h.rows.length, cols = Math.max(h.columns, 1);
    var cell = Math.max(2, Math.min(8, Math.floor(960 / cols)));
    var rowH = rows > 64 ? Math.max(1, Math.floor(512 / rows)) : 14;
    var gutter = rowH >= 10 ? 56 : 0;  // rank labels, where rows are tall enough to read
    canvas.width = gutter + cols * cell;
    canvas.height = Math.max(rows * rowH, 14);
    var ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    var all = [];
    h.values.forEach(function (row) { row.forEach(function (v) { if (v !== null) all.push(v); }); });
    all.sort(function (a, b) { return a - b; });
    var median = all.length ? all[Math.floor((all.length - 1) / 2)] : 0;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    for (var r = 0; r < rows; r++) {
      var row = h.values[r];
      if (gutter) {
        ctx.fillStyle = "#6b7280";
        var who = h.rows[r][0] === h.rows[r][1] ? "rank " + h.rows[r][0] : h.rows[r][0] + "-" + h.rows[r][1];
        ctx.fillText(who, 2, r * rowH + rowH / 2, gutter - 4);
      }
      for (var c = 0; c < row.length; c++) {
        ctx.fillStyle = colour(row[c], median);
        ctx.fillRect(gutter + (cols - row.length + c) * cell, r * rowH, cell, rowH - (rowH >= 10 ? 1 : 0));
      }
    }
    canvas.dataset.gutter = gutter;
    canvas.dataset.cell = cell;
    canvas.dataset.rowH = rowH;
    var note = rows + " row" + (rows === 1 ? "" : "s") + " x the latest " + fmtSeconds(h.columns * h.tick_ms / 1000) + ", oldest left";
    if (h.ranks_per_row > 1) note += "; each row is the slowest of " + h.ranks_per_row + " ranks (aggregated)";
    note += median ? "; median " + fmtMs(median) + " per step" : "";
    $("heat-note").textContent = note;
  }

  function heatTip(ev) {
    var j = state.last, tip = $("heat-tip");
    if (!j) return;
    var canvas = $("heat"), rect = canvas.getBoundingClientRect();
    var cell = +canvas.dataset.cell, rowH = +canvas.dataset.rowH, gutter = +canvas.dataset.gutter;
    var r = Math.floor((ev.clientY - rect.top) / rowH), c = Math.floor((ev.clientX - rect.left - gutter) / cell);
    var h = j.heat;
    if (r < 0 || r >= h.rows.length || c < 0 || c >= h.columns) { tip.style.display = "none"; return; }
    var row = h.values[r], ago = (h.columns - 1 - c) * h.tick_ms / 1000, v = row[c - (h.columns - row.length)];
    var who = h.rows[r][0] === h.rows[r][1] ? "rank " + h.rows[r][0] : "ranks " + h.rows[r][0] + "-" + h.rows[r][1];
    tip.textContent = who + ", " + fmtSeconds(ago) + " ago: " + (v === null || v === undefined ? "no step" : fmtMs(v) + " per step");
    tip.style.left = (ev.clientX - rect.left + 12) + "px";
    tip.style.top = (ev.clientY - rect.top + 12) + "px";
    tip.style.display = "block";
  }

  function renderTimeline(j) {
    var list = $("timeline");
    clear(list);
    j.timeline.slice().reverse().forEach(function (e) {
      var li = el("li", { "data-kind": e.kind });
      li.appendChild(el("time", null, clock(e.t_ms)));
      li.appendChild(el("span", { class: "kind kind-" + e.kind }, e.kind));
      li.appendChild(document.createTextNode(e.text));
      list.appendChild(li);
    });
    if (j.timeline_dropped > 0) list.appendChild(el("li", null, j.timeline_dropped + " older entries dropped"));
  }

  function renderFailure(box, title, f) {
    var d = el("details", { open: "" });
    d.appendChild(el("summary", null, title + ": rank " + f.rank + " on " + f.host + " (" +
      (f.signal_name ? "killed by " + f.signal_name : "exit code " + f.exit_code) + ")"));
    if (f.error) d.appendChild(el("pre", null, f.error));
    var tail = f.stderr_tail;
    if (tail && tail.length) d.appendChild(el("pre", { class: "stderr" }, Array.isArray(tail) ? tail.join("\n") : tail));
    if (f.diagnosis) d.appendChild(el("pre", null, f.diagnosis));
    box.appendChild(d);
  }

  function renderReport(j) {
    var rep = j.report, box = $("report");
    var show = rep && (rep.root_cause || rep.hang || (rep.other_failures && rep.other_failures.length));
    $("report-section").hidden = !(show || j.hang_report);
    clear(box);
    if (!rep) return;
    if (rep.outcome) box.appendChild(el("p", null, "outcome: " + rep.outcome + (rep.message ? " (" + rep.message + ")" : "")));
    if (rep.root_cause) renderFailure(box, "root cause", rep.root_cause);
    (rep.other_failures || []).forEach(function (f) { renderFailure(box, "also failed", f); });
    if (rep.hang) {
      var d = el("details", { open: "" });
      d.appendChild(el("summary", null, "hang: " + rep.hang.summary));
      if (rep.hang.report) d.appendChild(el("pre", null, rep.hang.report));
      box.appendChild(d);
    }
    if (j.hang_report) {
      var p = el("p");
      p.appendChild(el("a", { href: "hang_report" }, "the hang report: every rank's stacks"));
      box.appendChild(p);
    }
  }

  // The daemon's list of jobs: a row each, a link to its page.
  function renderList(j) {
    $("run-id").textContent = "";
    $("facts").textContent = j.jobs.length + " job" + (j.jobs.length === 1 ? "" : "s") + " on this store";
    document.title = "ddprun-rendezvous: " + j.jobs.length + " job" + (j.jobs.length === 1 ? "" : "s");
    var body = $("jobs").tBodies[0];
    clear(body);
    j.jobs.forEach(function (x) {
      var tr = el("tr", { "data-job": x.run_id, "data-state": x.state, class: x.stragglers ? "straggler" : "" });
      var name = el("td");
      name.appendChild(el("a", { href: "ui?job=" + encodeURIComponent(x.run_id) }, x.run_id));
      tr.appendChild(name);
      [x.state, x.round, x.joined + " of " + x.nnodes, x.ranks_reporting + " of " + x.world_size,
        x.restarts === undefined ? "" : x.restarts, x.stragglers].forEach(function (v) { tr.appendChild(el("td", null, v)); });
      body.appendChild(tr);
    });
  }

  function render(j) {
    var t0 = performance.now();
    state.list = j.schema === "ddprun-jobs/1";
    $("jobs-section").hidden = !state.list;
    $("job-sections").hidden = state.list;
    if (state.list) {
      renderList(j);
      document.body.setAttribute("data-render-ms", (performance.now() - t0).toFixed(1));
      return;
    }
    state.last = j;
    renderHeader(j);
    renderRanks(j);
    renderHeat(j);
    renderTable(j);
    renderTimeline(j);
    renderReport(j);
    // How long this render took, for scripts and benchmarks (benchmarks/job_page_bench.sh).
    document.body.setAttribute("data-render-ms", (performance.now() - t0).toFixed(1));
  }

  function status() {
    var s = $("status");
    if (!state.lastOk) { s.textContent = ""; return; }
    var ago = (Date.now() - state.lastOk) / 1000;
    s.textContent = state.failures ? "ddprun does not answer (" + fmtSeconds(ago) + "): retrying" : "updated " + clock(state.lastOk);
  }

  function poll() {
    var ctl = typeof AbortController === "function" ? new AbortController() : null;
    var timer = ctl ? setTimeout(function () { ctl.abort(); }, 5000) : null;
    fetch(state.list ? "api/jobs" : "api/job" + location.search, { cache: "no-store", signal: ctl ? ctl.signal : undefined })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (j) {
        state.failures = 0;
        state.lastOk = Date.now();
        render(j);
        document.body.setAttribute("data-refreshes", String(++state.refreshes));  // for scripts and tests
        // The page's own memory, where the browser says (Chromium), for benchmarks/job_page_bench.sh.
        if (performance.memory) document.body.setAttribute("data-heap-bytes", String(performance.memory.usedJSHeapSize));
      })
      .catch(function () { state.failures++; })
      .then(function () { if (timer) clearTimeout(timer); status(); setTimeout(poll, REFRESH_MS); });
  }

  try {
    var first = JSON.parse($("initial").textContent);
    if (first) { state.lastOk = Date.now(); render(first); status(); }
  } catch (e) { /* the first poll fills the page */ }
  $("heat").addEventListener("mousemove", heatTip);
  $("heat").addEventListener("mouseleave", function () { $("heat-tip").style.display = "none"; });
  setTimeout(poll, REFRESH_MS);
})();
