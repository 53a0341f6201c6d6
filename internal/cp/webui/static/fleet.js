// fleet.js keeps the dashboard's fleet table (internal/cp/dashboard) live:
// it follows the page's server-sent events and swaps in the server-rendered
// rows. Loaded on every dashboard page; it does nothing without #fleet.
"use strict";

(function () {
  const table = document.getElementById("fleet");
  if (!table || !window.EventSource) return;
  const body = document.getElementById("fleet-rows");
  const es = new EventSource(table.dataset.events);
  es.addEventListener("reset", () => { body.replaceChildren(); });
  es.addEventListener("row", (ev) => {
    const tpl = document.createElement("template");
    tpl.innerHTML = "<table><tbody>" + ev.data + "</tbody></table>";
    const tr = tpl.content.querySelector("tr");
    if (!tr) return;
    const old = document.getElementById(tr.id);
    if (old) old.replaceWith(tr); else body.appendChild(tr);
  });
  es.addEventListener("remove", (ev) => {
    const old = document.getElementById(ev.data);
    if (old) old.remove();
  });
  table.dataset.live = "1";
})();
