// logs.js shows an instance's logs live on the dashboard's instance page
// (internal/cp/dashboard, GET /ui/instances/{id}/logs): it follows the
// server-sent events (one per line, named by stream: stdout, stderr,
// serial; "end" last) and keeps the newest lines. Leaving the page closes
// the EventSource, which ends the stream on the node. It does nothing
// without #instance-logs.
"use strict";

(function () {
  const box = document.getElementById("instance-logs");
  if (!box || !window.EventSource) return;
  const out = box.querySelector("pre.logs");
  const status = box.querySelector(".logs-status");
  const toggle = box.querySelector(".logs-toggle");
  const maxLines = 2000;
  let es = null;

  function add(stream, text) {
    const line = document.createElement("span");
    line.className = "log-line log-" + stream;
    line.textContent = text + "\n";
    const atBottom = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
    out.appendChild(line);
    while (out.childNodes.length > maxLines) out.removeChild(out.firstChild);
    if (atBottom) out.scrollTop = out.scrollHeight;
  }

  function stop(text) {
    if (es) es.close();
    es = null;
    status.textContent = text;
    toggle.textContent = "Resume";
  }

  function start() {
    out.replaceChildren();
    es = new EventSource(box.dataset.src);
    status.textContent = "connecting…";
    toggle.textContent = "Pause";
    es.addEventListener("open", () => { status.textContent = "live"; });
    for (const s of ["stdout", "stderr", "serial"]) {
      es.addEventListener(s, (ev) => add(s, ev.data));
    }
    es.addEventListener("end", (ev) => {
      let d = {};
      try { d = JSON.parse(ev.data); } catch (e) { d = { reason: "error", message: ev.data }; }
      if (d.reason === "eof") stop("ended");
      else stop("ended: " + (d.code || d.reason) + (d.message ? " — " + d.message : "") +
        (d.correlation_id ? " (correlation id " + d.correlation_id + ")" : ""));
    });
    es.addEventListener("error", () => { if (es) stop("disconnected"); });
  }

  toggle.addEventListener("click", () => { if (es) stop("paused"); else start(); });
  window.addEventListener("pagehide", () => { if (es) es.close(); });
  start();
  box.dataset.live = "1";
})();
