// Refreshes the overview (agents, and their runs) from /api/overview every 5 s. Values are written
// with textContent, never as markup: agent names, run ids and failure kinds are shown as text
// whatever they hold.
"use strict";
(function () {
  const table = document.getElementById("overview");
  if (!table) return;
  const pct = (v) => (v === null ? "-" : (100 * v).toFixed(1) + "%");
  const num = (v, d) => (v === null || v === undefined ? "-" : Number(v).toFixed(d));
  const show = {
    queued: (a) => String(a.queued), in_flight: (a) => String(a.in_flight), lag: (a) => String(a.lag),
    delayed: (a) => String(a.delayed), dead: (a) => String(a.dead),
    done_per_min: (a) => num(a.done_per_min, 1), failed_per_min: (a) => num(a.failed_per_min, 1),
    cancelled_per_min: (a) => num(a.cancelled_per_min, 1),
    failure_rate: (a) => pct(a.failure_rate),
    failures_by_kind: (a) => Object.entries(a.failures_by_kind).map(([k, n]) => k + " " + n).join(", "),
    mean_reward: (a) => num(a.mean_reward, 3), pass_rate: (a) => pct(a.pass_rate),
    latency_p50_s: (a) => (a.latency_p50_s === null ? "-" : String(a.latency_p50_s)),
    latency_p99_s: (a) => (a.latency_p99_s === null ? "-" : String(a.latency_p99_s)),
    tokens_per_s: (a) => num(a.tokens_per_s, 1), live_workers: (a) => String(a.live_workers),
  };
  const runShow = {
    run_id: (x) => String(x.run_id), share: (x) => String(x.share), cap: (x) => (x.cap ? String(x.cap) : "-"),
    queued: (x) => String(x.queued), in_flight: (x) => String(x.in_flight),
    done_per_min: (x) => num(x.done_per_min, 1), failed_per_min: (x) => num(x.failed_per_min, 1),
  };
  const runs = document.getElementById("runs");
  function cell(text) { const td = document.createElement("td"); td.textContent = text; return td; }
  function link(href, text) { const a = document.createElement("a"); a.href = href; a.textContent = text; return a; }
  function row(name, a) {
    const tr = document.createElement("tr");
    tr.dataset.agent = name;
    const first = document.createElement("td");
    first.className = "name";
    first.appendChild(link("/agents/" + encodeURIComponent(name), name));
    tr.appendChild(first);
    for (const key of Object.keys(show)) { const td = cell(show[key](a)); td.dataset.k = key; tr.appendChild(td); }
    const last = document.createElement("td");
    last.appendChild(link("/rollouts/" + encodeURIComponent(name), "rollouts"));
    last.appendChild(document.createTextNode(" "));
    last.appendChild(link("/dead/" + encodeURIComponent(name), "dead"));
    tr.appendChild(last);
    return tr;
  }
  function runRow(name, x) {
    const tr = document.createElement("tr");
    tr.dataset.agent = name;
    tr.dataset.run = x.run_id;
    const first = document.createElement("td");
    first.className = "name";
    first.appendChild(link("/agents/" + encodeURIComponent(name), name));
    tr.appendChild(first);
    for (const key of Object.keys(runShow)) {
      const td = cell(runShow[key](x));
      td.dataset.k = key;
      if (key === "run_id") td.className = "name";
      tr.appendChild(td);
    }
    return tr;
  }
  function runBody(view) {
    const body = document.createElement("tbody");
    for (const [name, a] of Object.entries(view.agents)) for (const x of a.runs || []) body.appendChild(runRow(name, x));
    if (!body.rows.length) {
      const td = cell("no run has tasks queued or in flight");
      td.colSpan = 8;
      body.appendChild(document.createElement("tr")).appendChild(td);
    }
    return body;
  }
  async function refresh() {
    try {
      const resp = await fetch("/api/overview", { cache: "no-store" });
      if (!resp.ok) return;
      const view = await resp.json();
      const body = document.createElement("tbody");
      for (const [name, a] of Object.entries(view.agents)) body.appendChild(row(name, a));
      table.replaceChild(body, table.tBodies[0]);
      if (runs) runs.replaceChild(runBody(view), runs.tBodies[0]);
      document.getElementById("updated").textContent = new Date(view.at * 1000).toLocaleTimeString();
    } catch (e) { /* the next refresh tries again */ }
  }
  setInterval(refresh, 5000);
})();
