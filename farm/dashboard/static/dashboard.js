// Every page refreshes itself: every few seconds (main's data-refresh-s, 5 by default; 0: never) it
// fetches its own URL again and puts the new page's <main> in place of the old one, keeping the scroll
// positions and open <details>. The new page is parsed by DOMParser (its scripts never run) and
// nothing is ever written as markup here, so whatever a model wrote stays text. A refresh is skipped
// while someone uses a form field (it has the focus, or something typed in it) or selects text.
// A refresh that fails (no answer, a 5xx such as the dashboard's 503 "Redis unavailable", a 4xx)
// shows a banner "not updated since HH:MM:SS: <reason>" until one succeeds. After each refresh the
// document gets a "farm:refreshed" event, for a page's own script to bind to its new elements.
"use strict";
(function () {
  const main = () => document.querySelector("main");
  const banner = document.getElementById("stale");
  const stamp = document.getElementById("updated");
  const every = Number((main() && main().dataset.refreshS) || 5);
  if (!main() || !(every > 0)) return;
  const TIMEOUT_MS = Math.max(4000, every * 1000);
  const two = (n) => String(n).padStart(2, "0");
  const clock = (d) => two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  let good = new Date();
  if (stamp) stamp.textContent = clock(good);

  // A select someone changed: with no option marked selected in the page, the first one is its default.
  function changedSelect(f) {
    const options = [...f.options];
    if (f.multiple) return options.some((o) => o.selected !== o.defaultSelected);
    const marked = options.findIndex((o) => o.defaultSelected);
    return f.selectedIndex !== (marked >= 0 ? marked : f.size > 1 ? -1 : 0);
  }

  function busy() {
    const m = main();
    const active = document.activeElement;
    if (active && m.contains(active) && active.matches("input, textarea, select, [contenteditable]")) return true;
    for (const f of m.querySelectorAll("input, textarea, select")) {
      const type = (f.type || "").toLowerCase();
      if (["hidden", "submit", "button", "reset", "image"].includes(type)) continue;
      if (type === "checkbox" || type === "radio") { if (f.checked !== f.defaultChecked) return true; continue; }
      if (f.tagName === "SELECT") { if (changedSelect(f)) return true; continue; }
      if (f.value !== f.defaultValue) return true;
    }
    const sel = window.getSelection && window.getSelection();
    return Boolean(sel && !sel.isCollapsed && sel.anchorNode && m.contains(sel.anchorNode));
  }

  function stale(reason) {
    if (!banner) return;
    banner.textContent = "not updated since " + clock(good) + ": " + reason;
    banner.hidden = false;
  }

  function fresh() {
    good = new Date();
    if (stamp) stamp.textContent = clock(good);
    if (banner) { banner.hidden = true; banner.textContent = ""; }
  }

  // Where each scrolled box in main is, by its position among main's boxes that can scroll.
  const BOXES = "table, pre, div, ol, ul, details";
  function remember(m) {
    return {
      boxes: [...m.querySelectorAll(BOXES)].map((el) => [el.scrollLeft, el.scrollTop]),
      open: [...m.querySelectorAll("details")].map((el) => el.open),
      x: window.scrollX, y: window.scrollY,
    };
  }
  function restore(m, was) {
    m.querySelectorAll("details").forEach((el, i) => { if (i < was.open.length) el.open = was.open[i]; });
    m.querySelectorAll(BOXES).forEach((el, i) => {
      const at = was.boxes[i];
      if (at && (at[0] || at[1])) { el.scrollLeft = at[0]; el.scrollTop = at[1]; }
    });
    window.scrollTo(was.x, was.y);
  }

  async function reason(resp) {
    let said = "";
    try {
      const body = await resp.text();
      if ((resp.headers.get("content-type") || "").includes("text/html")) {
        const doc = new DOMParser().parseFromString(body, "text/html");
        const el = doc.getElementById("error") || doc.querySelector("main") || doc.body;
        said = el ? el.textContent : "";
      } else {
        said = body;
      }
    } catch (e) { /* the status says enough */ }
    said = said.replace(/\s+/g, " ").trim().slice(0, 300);
    return resp.status + " " + (resp.statusText || "") + (said ? ": " + said : "");
  }

  let running = false;
  async function refresh() {
    if (running || document.hidden || busy()) return;
    running = true;
    try { await once(); } finally { running = false; }
  }

  async function once() {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), TIMEOUT_MS);
    let resp;
    try {
      resp = await fetch(window.location.href, {
        cache: "no-store", credentials: "same-origin", headers: { Accept: "text/html" }, signal: abort.signal,
      });
    } catch (e) {
      clearTimeout(timer);
      stale(abort.signal.aborted ? "no answer in " + TIMEOUT_MS / 1000 + " s" : "the dashboard does not answer (" + e.message + ")");
      return;
    }
    try {
      if (!resp.ok) {
        // an error page that is still the same error needs no banner: it says what is wrong
        if (!main().querySelector("#error")) stale((await reason(resp)).replace(/\s+:/, ":"));
        return;
      }
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      const next = doc.querySelector("main");
      if (!next) { stale("the answer held no page"); return; }
      if (busy()) return; // someone started typing while it loaded
      const old = main();
      const was = remember(old);
      const adopted = document.adoptNode(next);
      old.replaceWith(adopted);
      restore(adopted, was);
      if (doc.title) document.title = doc.title;
      fresh();
      document.dispatchEvent(new CustomEvent("farm:refreshed"));
    } catch (e) {
      stale(abort.signal.aborted ? "no answer in " + TIMEOUT_MS / 1000 + " s" : "could not read the answer (" + e.message + ")");
    } finally {
      clearTimeout(timer);
    }
  }

  async function loop() {
    await refresh();
    setTimeout(loop, every * 1000);
  }
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  setTimeout(loop, every * 1000);
})();
