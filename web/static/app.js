// The dashboard's one script: on a run page it follows the run's server-sent events, logs them, and swaps in the
// freshly rendered live part of the page. Everything it shows from an event is set as text, never as HTML.
"use strict";

function describe(e) {
  switch (e.event) {
    case "started": return (e.resumed ? "resumed " : "started ") + e.run_id + " (" + e.objective + ")";
    case "evaluating": return "evaluating c" + e.candidate + " on " + e.tasks + " " + e.phase + " tasks";
    case "evaluated": return "c" + e.candidate + " " + e.phase + ": mean " + Number(e.mean).toFixed(3) +
      " after " + e.rollouts_spent + " rollouts";
    case "reflecting": return "reflecting on c" + e.parent + "'s " + e.tool;
    case "proposed": return e.description ? "proposed for " + e.tool + ": " + e.description
      : "proposal for " + e.tool + " failed: " + (e.error || "?");
    case "stopped": return "search stopped: " + e.reason;
    case "finished": return "finished; best candidate c" + e.best;
    default: return JSON.stringify(e);
  }
}

function followRun(body) {
  const id = body.dataset.runId;
  const log = document.getElementById("event-log");
  const count = document.getElementById("event-count");
  let received = 0;
  let timer = null;
  let refreshing = false;

  function refresh() {
    timer = null;
    if (refreshing) { schedule(); return; }
    refreshing = true;
    fetch("/runs/" + encodeURIComponent(id) + "/live", { headers: { "Accept": "text/html" } })
      .then(r => r.ok ? r.text() : Promise.reject(r.status))
      .then(html => {
        // The fragment is rendered by the server with every value escaped, like the page itself.
        document.getElementById("live").innerHTML = html;
        const section = document.getElementById("progress-section");
        const status = section ? section.dataset.status : "";
        const stop = document.getElementById("stop");
        if (stop && status !== "running" && status !== "queued") stop.hidden = true;
        body.dataset.refreshes = String(Number(body.dataset.refreshes || 0) + 1);
      })
      .catch(() => {})
      .finally(() => { refreshing = false; });
  }
  function schedule() { if (!timer) timer = setTimeout(refresh, 800); }

  const source = new EventSource("/api/runs/" + encodeURIComponent(id) + "/events");
  source.addEventListener("progress", m => {
    let e;
    try { e = JSON.parse(m.data); } catch (_) { return; }
    received += 1;
    body.dataset.eventsReceived = String(received);
    const li = document.createElement("li");
    li.textContent = describe(e);
    li.className = "ev-" + e.event + (e.event === "proposed" ? (e.description ? " ok" : " failed") : "");
    log.appendChild(li);
    log.scrollTop = log.scrollHeight;
    count.textContent = "(" + received + ")";
    // Every event may follow a new checkpoint (the driver reports a proposal just before the search takes it in),
    // so each one schedules a refresh; the timer folds a burst of them into one request.
    schedule();
  });
  source.addEventListener("end", m => {
    source.close();
    let e = {};
    try { e = JSON.parse(m.data); } catch (_) {}
    body.dataset.ended = e.status || "ended";
    const li = document.createElement("li");
    li.textContent = "run " + (e.status || "ended") + (e.error ? ": " + e.error : "");
    log.appendChild(li);
    refresh();
  });
  source.addEventListener("error", () => { body.dataset.streamErrors = String(Number(body.dataset.streamErrors || 0) + 1); });

  const stop = document.getElementById("stop");
  if (stop) {
    stop.addEventListener("click", () => {
      const send = token => fetch("/api/runs/" + encodeURIComponent(id) + "/stop", {
        method: "POST",
        headers: token ? { "Authorization": "Bearer " + token } : {},
      });
      send(sessionStorage.getItem("tooltune-token")).then(r => {
        if (r.status === 401) {
          const token = window.prompt("This server needs its token (TOOLTUNE_TOKEN) to stop a run:");
          if (!token) return null;
          return send(token).then(r2 => { if (r2.ok) sessionStorage.setItem("tooltune-token", token); return r2; });
        }
        return r;
      }).then(r => { if (r && r.ok) { stop.disabled = true; stop.textContent = "Stopping after the current step…"; } });
    });
  }
}

document.addEventListener("DOMContentLoaded", () => {
  if (document.body.dataset.runId) followRun(document.body);
});
