// console.js - draws the console's pages from its JSON (console_http.h).
// Everything from the server goes into the page as text (textContent),
// never as HTML, so a transaction name or a lock key cannot inject
// markup.  Each page sets <body data-ready="1"> once it has drawn its
// data, and data-k attributes on the numbers, for the browser test.
"use strict";

const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k === "href" || k === "type" || k === "name" || k === "value" || k === "placeholder") e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const kid of kids) {
    if (kid === null || kid === undefined) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (r.status === 401) {
    location.href = "/login";
    throw new Error("not logged in");
  }
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.detail || body.title || "HTTP " + r.status);
  return body;
}

function setStatus(text, bad) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = "status" + (bad ? " error" : "");
}

function ready() {
  document.body.setAttribute("data-ready", "1");
}

function age(ms) {
  if (ms === null || ms === undefined) return "-";
  if (ms < 1000) return ms + " ms";
  if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
  return Math.round(ms / 60000) + " min";
}

function num(v, k, extra) {
  return el("td", Object.assign({ class: "num", "data-k": k }, extra || {}), v === null || v === undefined ? "-" : v);
}

function table(headers, rows) {
  const t = el("table", {});
  const tr = el("tr", {});
  for (const h of headers) tr.append(el("th", { class: h.num ? "num" : "" }, h.label || h));
  t.append(el("thead", {}, tr));
  const tb = el("tbody", {});
  for (const r of rows) tb.append(r);
  t.append(tb);
  return t;
}

function tile(value, label, key) {
  return el("div", { class: "tile" }, el("div", { class: "v", "data-k": key }, value), el("div", { class: "k" }, label));
}

function pill(text, cls) {
  return el("span", { class: "pill " + (cls || text) }, text);
}

// A line chart of 'series' ([{name, values}]) over times 't' (unix ms).
function chart(title, t, series, unit) {
  const W = 420, H = 160, L = 44, R = 8, T = 8, B = 22;
  const box = el("div", { class: "chart", "data-chart": title });
  box.append(el("div", {}, title));
  const s = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  let max = 0;
  for (const se of series) for (const v of se.values) if (v !== null && v > max) max = v;
  if (max <= 0) max = 1;
  const t0 = t.length ? t[0] : 0, t1 = t.length ? t[t.length - 1] : 1, span = Math.max(1, t1 - t0);
  const x = (ti) => L + ((ti - t0) / span) * (W - L - R);
  const y = (v) => T + (1 - v / max) * (H - T - B);
  s.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  s.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  s.append(svg("text", { x: L - 4, y: T + 10, "text-anchor": "end" }, fmt(max)));
  s.append(svg("text", { x: L - 4, y: H - B, "text-anchor": "end" }, "0"));
  s.append(svg("text", { x: L, y: H - 6 }, "-" + Math.round(span / 1000) + " s"));
  s.append(svg("text", { x: W - R, y: H - 6, "text-anchor": "end" }, "now"));
  let points = 0;
  series.forEach((se, i) => {
    let run = [];
    const flush = () => {
      if (run.length > 1) s.append(svg("polyline", { class: "l" + i, points: run.join(" ") }));
      else if (run.length === 1) {
        const [px, py] = run[0].split(",");
        s.append(svg("circle", { cx: px, cy: py, r: 2, class: "l" + i }));
      }
      run = [];
    };
    se.values.forEach((v, k) => {
      if (v === null) return flush();
      run.push(x(t[k]).toFixed(1) + "," + y(v).toFixed(1));
      points++;
    });
    flush();
  });
  box.setAttribute("data-points", String(points));
  box.append(s);
  const legend = el("div", { class: "legend" });
  const colors = ["#2b6cb0", "#d53f8c", "#1f8a4c"];
  series.forEach((se, i) => legend.append(el("span", {}, el("i", {}), se.name + (unit ? " (" + unit + ")" : ""))));
  legend.querySelectorAll("i").forEach((i, k) => (i.style.background = colors[k]));
  box.append(legend);
  return box;
}

function fmt(v) {
  if (v >= 100) return String(Math.round(v));
  if (v >= 10) return v.toFixed(1);
  return v.toFixed(2);
}

// ---------------------------------------------------------------- pages

async function overview(main) {
  const o = await getJSON("/api/overview");
  const up = o.nodes.filter((n) => n.state === "up").length;
  const leader = o.nodes.find((n) => n.leader);
  const f = o.finished_last_minute || {};
  main.replaceChildren(
    el("h1", {}, "Cluster"),
    el("div", { class: "tiles" },
      tile(up + " / " + o.nodes.length, "nodes up", "nodes_up"),
      tile(leader ? "node " + leader.node_id : "none", "leader", "leader"),
      tile(o.globals, "live global transactions", "globals"),
      tile(o.branches, "branches", "branches"),
      tile(o.locks, "global locks", "locks"),
      tile(f.committed || 0, "committed, last minute", "committed_last_minute"),
      tile(f.rolled_back || 0, "rolled back, last minute", "rolled_back_last_minute"),
      tile(f.failed || 0, "failed for good, last minute", "failed_last_minute")),
    el("h2", {}, "Nodes"),
    table(["node", "state", "role", "address", "version", "pid", { label: "heartbeat age", num: true }, "started"],
      o.nodes.map((n) => el("tr", { "data-node": n.node_id },
        el("td", {}, n.node_id), el("td", {}, pill(n.state)),
        el("td", {}, n.leader ? pill("leader", "leader") : "follower"),
        el("td", {}, n.address), el("td", {}, n.version || "-"), el("td", {}, n.pid || "-"),
        num(age(n.heartbeat_age_ms), "heartbeat_age"), el("td", {}, n.started_at)))),
    el("h2", {}, "Live global transactions by status"),
    o.globals_by_status.length === 0 ? el("p", { class: "muted" }, "none") :
      table(["status", { label: "count", num: true }],
        o.globals_by_status.map((g) => el("tr", {}, el("td", {}, pill(g.status_name)), num(g.count, "status_" + g.status_name)))));
}

function branchRows(g) {
  return g.branches.map((b) => el("tr", { class: "sub" },
    el("td", {}, "  branch " + b.branch_id), el("td", {}, b.type + " " + b.status),
    el("td", { colspan: 2 }, b.resource_id), el("td", { colspan: 3 }, b.lock_keys || (b.last_error ? "error: " + b.last_error : ""))));
}

async function globals(main) {
  const o = await getJSON("/api/globals?limit=200");
  const rows = [];
  for (const g of o.globals) {
    rows.push(el("tr", { "data-xid": g.xid },
      el("td", {}, el("a", { href: "/history?xid=" + encodeURIComponent(g.xid) }, g.xid)),
      el("td", {}, pill(g.status_name)), el("td", {}, g.application_id || "-"), el("td", {}, g.name || "-"),
      num(age(g.age_ms), "age"), num(g.branches.length, "branches"), num(g.locks, "locks")));
    rows.push(...branchRows(g));
  }
  main.replaceChildren(
    el("h1", {}, "Live global transactions"),
    el("p", { class: "muted", "data-k": "globals_count" }, o.count + " live" + (o.count > o.globals.length ? ", the oldest " + o.globals.length + " shown" : "")),
    o.globals.length === 0 ? el("p", { class: "muted" }, "none right now") :
      table(["xid", "status", "application", "name", { label: "age", num: true }, { label: "branches", num: true }, { label: "locks", num: true }], rows));
}

async function locks(main) {
  const o = await getJSON("/api/locks?limit=200");
  const parts = [
    el("h1", {}, "Global locks"),
    el("p", { class: "muted", "data-k": "locks_count" }, o.count + " held" + (o.count > o.locks.length ? ", the oldest " + o.locks.length + " shown" : "")),
    o.locks.length === 0 ? el("p", { class: "muted" }, "none right now") :
      table(["row", "holder", "holder status", "branch", "state", "since"],
        o.locks.map((l) => el("tr", { "data-row": l.row_key },
          el("td", {}, l.table + " " + l.pk), el("td", {}, l.xid), el("td", {}, l.holder_status || "-"),
          el("td", {}, l.branch_id), el("td", {}, pill(l.status)), el("td", {}, l.since)))),
    el("h2", {}, "Waiting registrations"),
  ];
  const w = [];
  for (const h of o.waiters) for (const q of h.queue || []) w.push(el("tr", {},
    el("td", {}, h.node_id), el("td", {}, h.holder), el("td", {}, q.xid), num(q.waiting_ms + " ms", "waiting"), num(q.timeout_in_ms + " ms", "timeout_in")));
  parts.push(w.length === 0 ? el("p", { class: "muted", "data-k": "waiters_count" }, "none") :
    table(["node", "waiting for", "waiter", { label: "waiting", num: true }, { label: "gives up in", num: true }], w));
  for (const u of o.waiters_unavailable) parts.push(el("p", { class: "error" }, "node " + u.node_id + ": " + u.why));
  main.replaceChildren(...parts);
}

async function history(main) {
  const q = new URLSearchParams(location.search);
  const form = el("form", { class: "search", method: "get", action: "/history" },
    el("input", { name: "xid", placeholder: "xid (or its start)", value: q.get("xid") || "" }),
    el("input", { name: "status", placeholder: "status (Committed, Rollbacked...)", value: q.get("status") || "" }),
    el("input", { name: "app", placeholder: "application", value: q.get("app") || "" }),
    el("input", { name: "name", placeholder: "transaction name", value: q.get("name") || "" }),
    el("input", { name: "minutes", placeholder: "last minutes (60)", value: q.get("minutes") || "" }),
    el("button", { type: "submit" }, "Search"));
  const parts = [el("h1", {}, "History"), form];
  const api = new URLSearchParams();
  for (const k of ["xid", "status", "app", "name", "minutes"]) if (q.get(k)) api.set(k, q.get(k));
  api.set("limit", "200");
  const o = await getJSON("/api/history?" + api.toString());
  parts.push(el("p", { class: "muted", "data-k": "history_count" }, o.history.length + " found"));
  parts.push(table(["xid", "status", "application", "name", { label: "branches", num: true }, { label: "took", num: true }, "ended"],
    o.history.map((h) => el("tr", { "data-xid": h.xid },
      el("td", {}, h.xid), el("td", {}, pill(h.status_name)), el("td", {}, h.application_id || "-"), el("td", {}, h.name || "-"),
      num(h.branches, "branches"), num(h.duration_ms + " ms", "duration"), el("td", {}, h.end_time)))));
  if (q.get("xid") && o.history.length <= 1) {
    try {
      const g = await getJSON("/api/global?xid=" + encodeURIComponent(q.get("xid")));
      parts.push(el("h2", {}, (g.live ? "Live: " : "Finished: ") + g.xid));
      parts.push(table(["branch", "type", "status", "resource"],
        (g.branches || []).map((b) => el("tr", {}, el("td", {}, b.branch_id), el("td", {}, b.type || b.branch_type || "-"),
          el("td", {}, b.status), el("td", {}, b.resource_id || "-")))));
    } catch (e) {
      parts.push(el("p", { class: "muted" }, q.get("xid") + ": " + e.message));
    }
  }
  main.replaceChildren(...parts);
}

async function sale(main) {
  const q = new URLSearchParams(location.search);
  const acts = await getJSON("/api/activities");
  if (acts.length === 0) {
    main.replaceChildren(el("h1", {}, "Flash sale"), el("p", { class: "muted" }, "no activity in the stock database"));
    return;
  }
  const id = q.get("activity") || String(acts[0].activity_id);
  const [s, series] = await Promise.all([
    getJSON("/api/sale?activity=" + encodeURIComponent(id)),
    getJSON("/api/series?activity=" + encodeURIComponent(id) + "&seconds=300").catch(() => null),
  ]);
  const pick = el("select", { name: "activity" });
  for (const a of acts) {
    const o = el("option", { value: a.activity_id }, a.activity_id + " " + a.name + " (" + a.status + ")");
    if (String(a.activity_id) === id) o.selected = true;
    pick.append(o);
  }
  pick.addEventListener("change", () => (location.search = "?activity=" + pick.value));
  const tot = { stock: 0, frozen: 0, sold: 0, available: 0 };
  for (const b of s.buckets) for (const k in tot) tot[k] += b[k];
  const byStatus = s.orders_by_status || {};
  const rows = s.buckets.map((b) => {
    const bar = el("div", { class: "bar" });
    bar.append(el("div", { class: "sold" }), el("div", { class: "frozen" }));
    bar.children[0].style.width = (b.stock ? (100 * b.sold) / b.stock : 0) + "%";
    bar.children[1].style.width = (b.stock ? (100 * b.frozen) / b.stock : 0) + "%";
    const at = { "data-type": b.ticket_type, "data-bucket": b.bucket_id };
    return el("tr", at, el("td", {}, b.ticket_type), el("td", {}, b.bucket_id),
      num(b.stock, "stock", at), num(b.frozen, "frozen", at), num(b.sold, "sold", at), num(b.available, "available", at),
      el("td", {}, bar));
  });
  const parts = [
    el("h1", {}, "Flash sale: " + s.name + " (" + s.status + ")"),
    el("form", { class: "search" }, el("label", {}, "Activity ", pick)),
    el("div", { class: "tiles" },
      tile(tot.stock, "tickets", "total_stock"), tile(tot.frozen, "frozen (unpaid orders)", "total_frozen"),
      tile(tot.sold, "sold (paid)", "total_sold"), tile(tot.available, "available", "total_available"),
      tile(byStatus.UNPAID || 0, "orders unpaid", "orders_UNPAID"), tile(byStatus.PAID || 0, "orders paid", "orders_PAID"),
      tile((byStatus.CANCELLED || 0) + (byStatus.EXPIRED || 0), "orders cancelled or expired", "orders_ended")),
  ];
  if (series && series.t.length) {
    parts.push(el("h2", {}, "The last " + Math.round((series.t[series.t.length - 1] - series.t[0]) / 1000) + " s"));
    parts.push(el("div", { class: "charts" },
      chart("orders per second", series.t, [{ name: "requests", values: series.requests_per_s }, { name: "accepted", values: series.accepted_per_s }], "/s"),
      chart("latency of POST /orders", series.t, [{ name: "p50", values: series.p50_ms }, { name: "p99", values: series.p99_ms }], "ms"),
      chart("tickets", series.t, [{ name: "available", values: series.available }, { name: "frozen", values: series.frozen }, { name: "sold", values: series.sold }], "")));
    if (series.last_error) parts.push(el("p", { class: "error" }, "sampling: " + series.last_error));
  }
  parts.push(el("h2", {}, "Buckets"));
  parts.push(table(["type", "bucket", { label: "stock", num: true }, { label: "frozen", num: true }, { label: "sold", num: true }, { label: "available", num: true }, "sold / frozen"], rows));
  main.replaceChildren(...parts);
}

const PAGES = { "/": ["overview", overview], "/globals": ["globals", globals], "/locks": ["locks", locks], "/history": ["history", history], "/sale": ["sale", sale] };

async function draw() {
  const [name, fn] = PAGES[location.pathname] || PAGES["/"];
  document.body.setAttribute("data-page", name);
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.getAttribute("data-nav") === name));
  const main = document.getElementById("main");
  try {
    await fn(main);
    setStatus("updated " + new Date().toLocaleTimeString());
    ready();
  } catch (e) {
    setStatus(e.message, true);
  }
  if (name !== "history") setTimeout(draw, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", draw);
