// The DLT console's page: fetches the console's JSON API and draws it.
// Every value from the API is set as text (textContent, attributes through
// setAttribute), never parsed as markup: DLT records are attacker-written.
"use strict";

const $ = (sel) => document.querySelector(sel);
const SVG = "http://www.w3.org/2000/svg";
const COLOURS = ["#2f6fde", "#e8772e", "#2aa876", "#c0392b", "#8e5cc4", "#b38f00", "#17a2b8", "#6b7385"];
let settings = { actions: false, record_contents: false, refresh_seconds: 5 };
let refreshTimer = null;

// An element with attributes and children (strings become text nodes).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else e.setAttribute(k, String(v));
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c ?? ""));
  return e;
}

async function api(path, options) {
  const r = await fetch(path, Object.assign({ headers: { accept: "application/json" } }, options));
  let body;
  try { body = await r.json(); } catch (_) { body = { error: r.status + " " + r.statusText }; }
  if (!r.ok) throw new Error(body.error || String(r.status));
  return body;
}

// POST an action with the header the server requires of the page and the
// console token the operator typed (admin.console_token_file or _env); the
// token stays in the field, never in storage.
function post(path, body) {
  return api(path, {
    method: "POST",
    headers: {
      accept: "application/json", "content-type": "application/json", "x-antidote-console": "1",
      authorization: "Bearer " + $("#token").value,
    },
    body: JSON.stringify(body),
  });
}

function fill(table, rows, empty) {
  const tbody = $(table + " tbody");
  tbody.replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" }, el("td", { colspan: 9 }, empty))]));
}

const time = (ms) => (ms === null || ms === undefined ? "–" : new Date(ms).toISOString().replace(".000Z", "Z"));
const shown = (v, size) => (v === null || v === undefined ? (size === null || size === undefined ? "null" : `(${size} bytes, hidden)`) : v);

// ---- overview -------------------------------------------------------------

const HOLD_REASONS = {
  dlt_write: "a diversion the DLT has not acknowledged (DLT outage?)",
  breaker: "circuit breaker open",
  transient: "schema registry has not answered for a record's schema",
  undecodable: "a batch that cannot be decoded",
  legacy: "a legacy (v0/v1) batch",
  budget: "no decode budget left",
};

function drawChart(history) {
  const W = 960, H = 180, left = 40, bottom = 20, top = 10;
  const n = history.minutes;
  const totals = new Array(n).fill(0);
  history.series.forEach((s) => s.counts.forEach((c, i) => (totals[i] += c)));
  const max = Math.max(1, ...totals);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "diversions per minute");
  const bw = (W - left) / n;
  const y = (v) => H - bottom - ((H - bottom - top) * v) / max;
  const stack = new Array(n).fill(0);
  history.series.forEach((s, si) => {
    s.counts.forEach((c, i) => {
      if (!c) return;
      const r = document.createElementNS(SVG, "rect");
      r.setAttribute("x", left + i * bw + 1);
      r.setAttribute("width", Math.max(1, bw - 2));
      r.setAttribute("y", y(stack[i] + c));
      r.setAttribute("height", y(stack[i]) - y(stack[i] + c));
      r.setAttribute("fill", COLOURS[si % COLOURS.length]);
      const t = document.createElementNS(SVG, "title");
      t.textContent = `${s.topic ?? "(other topics)"} ${s.class}: ${c} at ${time(history.first_minute_ms + i * 60000)}`;
      r.append(t);
      svg.append(r);
      stack[i] += c;
    });
  });
  const text = (x, yy, s, anchor) => {
    const t = document.createElementNS(SVG, "text");
    t.setAttribute("x", x); t.setAttribute("y", yy); t.setAttribute("font-size", "11");
    t.setAttribute("fill", "#6b7385"); t.setAttribute("text-anchor", anchor || "start");
    t.textContent = s; svg.append(t);
  };
  const axis = document.createElementNS(SVG, "line");
  axis.setAttribute("x1", left); axis.setAttribute("x2", W); axis.setAttribute("y1", H - bottom); axis.setAttribute("y2", H - bottom);
  axis.setAttribute("stroke", "#dde1e8"); svg.append(axis);
  text(left - 4, top + 10, String(max), "end");
  text(left - 4, H - bottom, "0", "end");
  text(left, H - 4, "−60 min");
  text(left + (W - left) / 2, H - 4, "−30 min", "middle");
  text(W, H - 4, "now", "end");
  $("#chart").replaceChildren(svg);
  $("#legend").replaceChildren(...history.series.map((s, si) =>
    el("span", { "data-topic": s.topic ?? "", "data-class": s.class, "data-total": s.total },
      el("i", { style: null, class: "swatch" + si }), `${s.topic ?? "(other topics)"} · ${s.class}: ${s.total}`)));
  // Swatch colours through the CSSOM (no inline style attributes: CSP).
  document.querySelectorAll("#legend i").forEach((i, si) => (i.style.background = COLOURS[si % COLOURS.length]));
  $("#hour-total").textContent = String(totals.reduce((a, b) => a + b, 0));
}

function renderOverview(o) {
  settings = o.settings;
  $("#status").textContent = `antidote ${o.version} · updated ${time(o.now_ms)} · ` +
    (o.settings.actions ? "actions enabled" : "read-only") + " · record contents " +
    (o.settings.record_contents ? "shown" : "hidden (logging.record_contents is off)");
  drawChart(o.history);
  fill("#diverted", o.diverted.map((d) =>
    el("tr", { "data-topic": d.topic, "data-class": d.class, "data-count": d.count },
      el("td", {}, d.topic), el("td", {}, d.class), el("td", { class: "n" }, d.count))), "nothing diverted since the proxy started");
  fill("#invalid", o.invalid.map((i) =>
    el("tr", {}, el("td", {}, i.topic), el("td", { class: "n" }, i.partition), el("td", {}, i.policy),
      el("td", {}, i.class), el("td", {}, i.rule), el("td", {}, i.action), el("td", { class: "n" }, i.count))), "no invalid record");
  fill("#held", o.held.map((h) =>
    el("tr", { "data-topic": h.topic, "data-partition": h.partition, "data-reason": h.reason },
      el("td", {}, h.topic), el("td", { class: "n" }, h.partition), el("td", {}, `${h.reason}: ${HOLD_REASONS[h.reason] || ""}`))), "no partition held");
  fill("#breakers", o.breakers.map((b) => {
    const close = settings.actions ? el("button", { type: "button" }, "close (judge again)") : "";
    if (close) close.addEventListener("click", () => closeBreaker(b.topic, b.partition));
    return el("tr", { "data-topic": b.topic, "data-partition": b.partition },
      el("td", {}, b.topic), el("td", { class: "n" }, b.partition), el("td", { class: "n" }, b.held_at), el("td", {}, close));
  }), "no breaker open");
  const bk = o.blocked_keys;
  fill("#blocked", bk.keys.map((k) =>
    el("tr", { "data-topic": k.topic, "data-partition": k.partition }, el("td", {}, k.topic), el("td", { class: "n" }, k.partition), el("td", {}, shown(k.key, k.key_size)),
      el("td", { class: "n" }, k.first_offset), el("td", { class: "n" }, k.last_offset), el("td", {}, k.class), el("td", {}, time(k.since_ms)))), "no key blocked");
  $("#blocked-oldest").textContent = bk.oldest_age_seconds === null ? "" : `(oldest blocked for ${bk.oldest_age_seconds} s)`;
  const card = (id, v) => { const e = $(id); e.textContent = String(v); e.classList.toggle("alert", v > 0); };
  card("#held-count", o.held.length);
  card("#breaker-count", o.breakers.length);
  card("#blocked-count", bk.count);
  card("#ledger-lag", o.ledger_lag);
  $("#execute").hidden = !settings.actions;
}

async function refreshOverview() {
  try {
    renderOverview(await api("/console/api/overview"));
  } catch (e) {
    $("#status").textContent = "overview failed: " + e.message;
  }
}

function scheduleRefresh() {
  clearInterval(refreshTimer);
  refreshTimer = setInterval(() => {
    if (!document.hidden && !$("#overview").hidden) refreshOverview();
  }, (settings.refresh_seconds || 5) * 1000);
}

async function closeBreaker(topic, partition) {
  if (!confirm(`Close the breaker of ${topic}-${partition}? The held record is judged again.`)) return;
  try {
    const r = await post("/console/api/breaker/close", { topic, partition });
    alert(r.line);
  } catch (e) { alert("close failed: " + e.message); }
  refreshOverview();
}

// ---- forms ----------------------------------------------------------------

// The form's non-empty fields as query parameters.
function params(form, extra) {
  const p = new URLSearchParams();
  for (const [k, v] of new FormData(form)) if (String(v).trim() !== "") p.set(k, String(v).trim());
  for (const [k, v] of Object.entries(extra || {})) p.set(k, String(v));
  return p;
}

async function loadDlts() {
  try {
    const r = await api("/console/api/dlts");
    document.querySelectorAll(".dlt-select").forEach((s) => {
      const keep = s.value;
      s.replaceChildren(...r.topics.map((t) => el("option", { value: t }, t)));
      if (keep && r.topics.includes(keep)) s.value = keep;
    });
  } catch (e) {
    $("#browse-info").textContent = "listing the DLTs failed: " + e.message;
  }
}

// ---- DLT browser ----------------------------------------------------------

let pages = [];   // positions of the pages shown so far (for "previous")
let nextPos = null;

function recordRows(r) {
  const row = el("tr", { class: "rec", "data-coordinate": `${r.dlt_topic}/${r.dlt_partition}/${r.dlt_offset}`, "data-class": r.class, "data-rule": r.rule },
    el("td", {}, `${r.dlt_partition}/${r.dlt_offset}`),
    el("td", {}, `${r.origin_topic ?? "?"}-${r.origin_partition ?? "?"}@${r.origin_offset ?? "?"}`),
    el("td", {}, r.class), el("td", {}, r.rule), el("td", {}, r.failed_at ?? "–"),
    el("td", {}, shown(r.key, r.key_size)), el("td", {}, r.reason ?? "(hidden)"));
  const parts = [];
  if (r.withheld) parts.push(el("p", { class: "dim" }, `${r.withheld} (value ${r.value_size ?? 0} bytes)`));
  else {
    parts.push(el("p", {}, `value (${r.value_size ?? 0} bytes${r.value_cut ? ", cut" : ""}):`), el("pre", { class: "value" }, r.value ?? "null"));
    if (r.decoded) {
      if (r.decoded.text !== undefined) parts.push(el("p", {}, `decoded${r.decoded.cut ? " (cut)" : ""}:`), el("pre", { class: "decoded" }, r.decoded.text));
      else parts.push(el("p", { class: "error decoded" }, "not decoded: " + (r.decoded.error ?? "")));
    }
  }
  const cr = r.contract_rule;  // antidote's own context only (signed with signing keys)
  if (cr) parts.push(el("p", { class: "contract-rule" }, `data-contract rule ${cr.name} · mode ${cr.mode} · subject ${cr.subject} · topic ${cr.topic}` + (cr.exception == null ? "" : ` · ${cr.exception}`)));
  if (r.headers.length) parts.push(el("p", {}, "headers: " + r.headers.map((h) => `${h.key}=${h.value ?? (r.withheld ? "(hidden)" : "null")}`).join(", ")));
  parts.push(el("p", { class: "dim" }, `policy ${r.policy} · attempt ${r.attempt} · origin timestamp ${time(r.origin_timestamp)}`));
  const detail = el("tr", { class: "detail", hidden: true }, el("td", { colspan: 7 }, ...parts));
  row.addEventListener("click", () => (detail.hidden = !detail.hidden));
  return [row, detail];
}

async function browse(pos) {
  const form = $("#browse-form");
  const p = params(form, pos ? { partition: pos.partition, offset: pos.offset } : {});
  $("#browse-info").textContent = "reading…";
  try {
    const r = await api("/console/api/records?" + p);
    const spans = r.partitions.map((s) => `partition ${s.partition}: offsets ${s.start}–${s.end}`).join(" · ");
    $("#browse-info").textContent = `${r.records.length} record(s) on this page, ${r.scanned} read · ${spans}`;
    fill("#records", r.records.flatMap(recordRows), "no record matches on this page");
    nextPos = r.next;
    $("#next").disabled = !nextPos;
    $("#prev").disabled = pages.length <= 1;
  } catch (e) {
    $("#browse-info").textContent = "";
    fill("#records", [el("tr", {}, el("td", { colspan: 7, class: "error" }, e.message))]);
  }
}

// ---- replay ---------------------------------------------------------------

function outcomeRows(list) {
  return list.map((o) => el("tr", { class: "kind-" + o.kind, "data-kind": o.kind, "data-coordinate": o.coordinate ?? "", "data-line": o.line },
    el("td", {}, o.kind.replace("_", " ")), el("td", {}, o.coordinate ?? ""), el("td", {}, o.target ?? ""),
    el("td", {}, o.verdict ?? ""), el("td", {}, o.reason ?? "")));
}

const summary = (rep, execute) =>
  `${rep.considered} considered, ${execute ? rep.replayed + " replayed" : rep.would_replay + " would be replayed"}, ` +
  `${rep.already_replayed} already replayed, ${rep.still_invalid} still invalid, ${rep.refused} refused, ${rep.failed} failed`;

async function preview() {
  const p = params($("#replay-form"));
  $("#replay-summary").textContent = "previewing…";
  try {
    const r = await api("/console/api/replay/preview?" + p);
    $("#replay-summary").textContent = "dry run (nothing written): " + summary(r.report, false) +
      (r.more ? ` · ${r.more} more not shown` : "") + (r.notices.length ? " · " + r.notices.join("; ") : "");
    fill("#outcomes", outcomeRows(r.outcomes), "no record selected");
  } catch (e) {
    $("#replay-summary").textContent = "";
    fill("#outcomes", [el("tr", {}, el("td", { colspan: 5, class: "error" }, e.message))]);
  }
}

async function execute() {
  const form = $("#replay-form");
  const body = Object.fromEntries(params(form, { rate: $("#rate").value }));
  if (!confirm(`Replay from ${body.topic} at ${body.rate} records/s? Records are written back to their topics.`)) return;
  try {
    await post("/console/api/replay/execute", body);
    pollJob();
  } catch (e) { $("#job").textContent = "not started: " + e.message; }
}

async function pollJob() {
  try {
    const { job } = await api("/console/api/replay/job");
    if (!job) return;
    $("#job").textContent = `replay ${job.id} of ${job.topic}: ` + (job.running ? "running · " : "finished · ") +
      summary(job.report, true) + (job.error ? " · error: " + job.error : "");
    fill("#outcomes", outcomeRows(job.outcomes), "nothing yet");
    if (job.running) setTimeout(pollJob, 1000);
  } catch (e) { $("#job").textContent = e.message; }
}

// ---- wiring ---------------------------------------------------------------

function showTab(name) {
  document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("on", t.dataset.tab === name));
  for (const id of ["overview", "browser", "replay"]) $("#" + id).hidden = id !== name;
  if (name === "overview") refreshOverview();
  else loadDlts();
}

document.addEventListener("DOMContentLoaded", async () => {
  document.querySelectorAll(".tab").forEach((t) => t.addEventListener("click", () => showTab(t.dataset.tab)));
  $("#browse-form").addEventListener("submit", (ev) => { ev.preventDefault(); pages = [null]; browse(null); });
  $("#next").addEventListener("click", () => { pages.push(nextPos); browse(nextPos); });
  $("#prev").addEventListener("click", () => { pages.pop(); browse(pages[pages.length - 1]); });
  $("#replay-form").addEventListener("submit", (ev) => { ev.preventDefault(); preview(); });
  $("#execute-button").addEventListener("click", execute);
  await refreshOverview();
  scheduleRefresh();
  loadDlts();
});
