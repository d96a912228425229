// The inspector's behaviour: sort and filter the sessions table, open a request in place, follow a live session.
// No framework and no build step. Every piece of HTML this script inserts was rendered (and escaped) by the server.
"use strict";

const POLL_MS = 2000;

function sortable(table) {
  const headers = Array.from(table.querySelectorAll("th"));
  headers.forEach((th, column) => {
    th.querySelector("button").addEventListener("click", () => {
      const numeric = th.dataset.type === "num";
      const descending = th.getAttribute("aria-sort") === "ascending";
      headers.forEach((other) => other.removeAttribute("aria-sort"));
      th.setAttribute("aria-sort", descending ? "descending" : "ascending");
      const value = (row) => row.cells[column].dataset.sort ?? row.cells[column].textContent.trim();
      const rows = Array.from(table.tBodies[0].rows);
      rows.sort((a, b) => {
        const order = numeric ? Number(value(a)) - Number(value(b)) : value(a).localeCompare(value(b));
        return descending ? -order : order;
      });
      table.tBodies[0].append(...rows);
    });
  });
}

function filtering(input, table) {
  input.addEventListener("input", () => {
    const needle = input.value.trim().toLowerCase();
    for (const row of table.tBodies[0].rows) {
      row.hidden = needle !== "" && !row.textContent.toLowerCase().includes(needle);
    }
  });
}

async function openRequest(link) {
  const panel = document.getElementById("request-panel");
  const url = new URL(link.getAttribute("href"), location.href);
  url.searchParams.set("fragment", "1");
  const response = await fetch(url, { credentials: "same-origin" });
  if (!response.ok) {
    panel.textContent = `Could not load this request (${response.status}).`;
    return;
  }
  panel.innerHTML = await response.text();
  document.querySelectorAll("a.point.selected").forEach((a) => a.classList.remove("selected"));
  document.querySelectorAll(`a.point[data-seq="${panel.firstElementChild.dataset.seq}"]`)
    .forEach((a) => a.classList.add("selected"));
  panel.scrollIntoView({ block: "start" });
}

function follow(main) {
  const tail = main.dataset.tail === "1";
  const tick = async () => {
    try {
      const url = new URL(main.dataset.live, location.href);
      url.searchParams.set("since", main.dataset.since);
      url.searchParams.set("tail", tail ? "1" : "0");
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (response.status === 401 || !response.ok) return;  // signed out or gone: stop following
      const update = await response.json();
      if (update.reload) {
        location.reload();
        return;
      }
      if (update.since > Number(main.dataset.since)) {
        document.getElementById("summary").innerHTML = update.summary;
        document.getElementById("timeline").innerHTML = update.timeline;
        if (update.log) document.getElementById("log").insertAdjacentHTML("beforeend", update.log);
        main.dataset.since = update.since;
      }
      reading = update.reading === true;
    } catch (error) {
      reading = false;  // the proxy restarting or the network dropping: try again at the next tick
    }
    setTimeout(tick, reading ? 0 : POLL_MS);
  };
  // A long log is read a stretch per look: while the proxy is still reading it, ask for the next stretch at once.
  let reading = main.dataset.reading === "1";
  setTimeout(tick, reading ? 0 : POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  const table = document.querySelector("table.sortable");
  if (table) sortable(table);
  const filter = document.getElementById("filter");
  if (filter && table) filtering(filter, table);
  document.addEventListener("click", (event) => {
    const link = event.target.closest("a.point, a.req");
    if (!link || !document.getElementById("request-panel") || event.ctrlKey || event.metaKey || event.shiftKey) return;
    event.preventDefault();
    openRequest(link);
  });
  const main = document.querySelector("main[data-live]");
  if (main) follow(main);
});
