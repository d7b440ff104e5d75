// The Flux dashboard: polls the JSON API every 2 s and redraws the tables and charts.
// No framework and no build step; every value goes into the page as text, never as HTML.
"use strict";

const REFRESH_MS = 2000;
const state = { topic: null, offset: 0, timer: null };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const fmt = {
  int: (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US")),
  rate: (r) => (r >= 100 ? Math.round(r).toLocaleString("en-US") : r >= 10 ? r.toFixed(1) : r.toFixed(2)),
  bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
  },
  duration(s) {
    if (s === null || s === undefined) return "–";
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
    const m = Math.floor((s % 3600) / 60), sec = s % 60;
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${m}m`;
    return m ? `${m}m ${sec}s` : `${sec}s`;
  },
  time: (t) => new Date(t * 1000).toLocaleTimeString("en-GB", { hour12: false }),
};

async function getJSON(path) {
  const response = await fetch(path, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok && !path.startsWith("healthz")) {
    throw new Error(body.message || `${response.status} ${response.statusText}`);
  }
  return body;
}

function fillTable(id, rows) {
  const table = document.getElementById(id);
  const body = table.tBodies[0];
  body.replaceChildren(...rows);
  const empty = document.getElementById(id + "-empty");
  if (empty) empty.hidden = rows.length > 0;
}

function drawChart(id, series) {
  const svg = document.getElementById(id);
  const points = series.slice(-300);
  const caption = svg.parentNode.querySelector("figcaption");
  let now = caption.querySelector(".now");
  if (!now) { now = el("span", { class: "now" }); caption.append(now); }
  now.textContent = points.length ? fmt.rate(points[points.length - 1][1]) : "–";
  if (points.length < 2) { svg.replaceChildren(); return; }
  const t0 = points[0][0], t1 = points[points.length - 1][0];
  const max = Math.max(1, ...points.map((p) => p[1]));
  const xy = points.map(([t, v]) =>
    `${((t - t0) / Math.max(1e-9, t1 - t0) * 300).toFixed(1)},${(58 - v / max * 54).toFixed(1)}`);
  const ns = "http://www.w3.org/2000/svg";
  const area = document.createElementNS(ns, "polygon");
  area.setAttribute("points", `0,60 ${xy.join(" ")} 300,60`);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", xy.join(" "));
  const title = document.createElementNS(ns, "title");
  title.textContent = `peak ${fmt.rate(max)} / s`;
  svg.replaceChildren(title, area, line);
}

function renderOverview(overview, health) {
  const pill = document.getElementById("health");
  pill.dataset.state = health.status;
  pill.textContent = health.status === "ok" ? "healthy" : health.message || health.status;
  const up = overview.shards.filter((s) => s.up).length;
  document.getElementById("card-shards").textContent = `${up} / ${overview.shard_count}`;
  document.getElementById("card-topics").textContent = fmt.int(overview.topics);
  document.getElementById("card-subs").textContent = fmt.int(overview.subscriptions);
  document.getElementById("card-in").textContent = fmt.rate(overview.rates.published);
  document.getElementById("card-out").textContent = fmt.rate(overview.rates.delivered);
  document.getElementById("updated").textContent =
    `stats of ${fmt.time(overview.wall)} (${overview.age.toFixed(1)} s old)`;
  for (const key of ["published", "delivered", "acked", "redelivered"]) {
    drawChart("chart-" + key, overview.series[key] || []);
  }
  fillTable("shards", overview.shards.map((s) => {
    const memory = s.max_memory ? s.memory / s.max_memory : 0;
    return el("tr", { "data-shard": s.index },
      el("td", { class: "num" }, s.index),
      el("td", { class: "state" }, s.up ? "up" : (s.registered ? "not answering" : "not registered")),
      el("td", {}, s.generation || "–"),
      el("td", { class: "num" }, fmt.duration(s.uptime)),
      el("td", { class: "num" }, fmt.int(s.sessions)),
      el("td", { class: "num" }, fmt.int(s.topics)),
      el("td", {}, el("span", { class: "bar", style: `width:${Math.max(1, memory * 80)}px` }),
        `${fmt.bytes(s.memory)} of ${fmt.bytes(s.max_memory)}`),
      el("td", { class: "num" }, fmt.int(s.restarts)));
  }));
}

function renderTopics(topics) {
  fillTable("topics", topics.map((t) => el("tr", { "data-topic": t.topic },
    el("td", {}, el("a", { class: "topic-link", href: `#topic=${encodeURIComponent(t.topic)}` }, t.topic)),
    el("td", { class: "num" }, t.shard),
    el("td", { class: "num" }, fmt.int(t.oldest)),
    el("td", { class: "num" }, fmt.int(t.next_offset)),
    el("td", { class: "num held" }, fmt.int(t.held)),
    el("td", { class: "num" }, fmt.bytes(t.held_bytes)),
    el("td", { class: "storage" }, t.storage === "disk" ? `disk (${fmt.bytes(t.log_bytes)} log)` : "memory"),
    el("td", { class: "num" }, fmt.rate(t.rate_in)),
    el("td", { class: "num" }, t.subscriptions))));
}

function renderSubscriptions(subs) {
  const behind = subs.filter((s) => s.lag > 0);
  const card = document.getElementById("card-behind");
  card.classList.toggle("behind", behind.length > 0);
  card.textContent = behind.length
    ? `${behind[0].name} on ${behind[0].topic}: ${fmt.int(behind[0].lag)} behind`
    : (subs.length ? "none: all caught up" : "–");
  const maxLag = Math.max(1, ...subs.map((s) => s.lag));
  fillTable("subscriptions", subs.map((s) => el("tr", {
    "data-topic": s.topic, "data-name": s.name,
    class: `${s.lag > 0 ? "behind" : ""} ${s.active ? "" : "inactive"}`,
  },
  el("td", {}, el("a", { class: "topic-link", href: `#topic=${encodeURIComponent(s.topic)}&offset=${s.cursor}` }, s.topic)),
  el("td", { class: "name" }, s.ephemeral ? `${s.name} (ephemeral)` : s.name),
  el("td", {}, s.mode),
  el("td", { class: "state" }, s.active ? "active" : "inactive"),
  el("td", { class: "num cursor" }, fmt.int(s.cursor)),
  el("td", { class: "num lag" }, el("span", { class: "bar", style: `width:${s.lag ? Math.max(2, s.lag / maxLag * 60) : 0}px` }), fmt.int(s.lag)),
  el("td", { class: "num" }, fmt.int(s.in_flight)),
  el("td", { class: "num redelivered" }, fmt.int(s.redelivered)),
  el("td", { class: "num" }, fmt.rate(s.ack_rate)))));
}

async function refresh() {
  try {
    const [overview, health, topics, subs] = await Promise.all([
      getJSON("api/overview"), getJSON("healthz"), getJSON("api/topics"),
      getJSON("api/subscriptions")]);
    renderOverview(overview, health);
    renderTopics(topics.topics);
    renderSubscriptions(subs.subscriptions);
  } catch (error) {
    const pill = document.getElementById("health");
    pill.dataset.state = "down";
    pill.textContent = `cannot reach the broker: ${error.message}`;
  }
}

// -- message browser ----------------------------------------------------------------

function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const topic = params.get("topic");
  if (!topic) { state.topic = null; document.getElementById("browser").hidden = true; return; }
  state.topic = topic;
  state.offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  document.getElementById("browser-offset").value = state.offset;
  loadMessages();
}

function setHash(topic, offset) {
  const hash = `#topic=${encodeURIComponent(topic)}&offset=${offset}`;
  if (location.hash === hash) loadMessages(); else location.hash = hash;
}

async function loadMessages() {
  const section = document.getElementById("browser");
  section.hidden = false;
  document.getElementById("browser-topic").textContent = state.topic;
  const limit = parseInt(document.getElementById("browser-limit").value, 10) || 20;
  const error = document.getElementById("browser-error");
  try {
    const page = await getJSON(`api/topics/${encodeURIComponent(state.topic)}/messages?offset=${state.offset}&limit=${limit}`);
    error.hidden = true;
    const last = page.messages.length ? page.messages[page.messages.length - 1].offset : null;
    document.getElementById("browser-range").textContent =
      `held: ${fmt.int(page.oldest)} … ${fmt.int(page.next - 1)} (next offset ${fmt.int(page.next)})` +
      (last === null ? " · nothing held from here" : ` · showing ${fmt.int(page.first)} … ${fmt.int(last)}`);
    fillTable("messages", page.messages.map((m) => el("tr", { "data-offset": m.offset },
      el("td", { class: "num" }, m.offset),
      el("td", {}, m.id),
      el("td", {}, fmt.time(m.timestamp)),
      el("td", { class: "num" }, fmt.bytes(m.size)),
      el("td", { class: "payload" }, el("span", { class: "enc" }, m.encoding),
        m.payload + (m.truncated ? " …" : "")))));
  } catch (e) {
    error.hidden = false;
    error.textContent = e.message;
    fillTable("messages", []);
  }
  section.scrollIntoView({ block: "nearest" });
}

function wireBrowser() {
  window.addEventListener("hashchange", readHash);
  document.getElementById("browser-form").addEventListener("submit", (event) => {
    event.preventDefault();
    setHash(state.topic, Math.max(0, parseInt(document.getElementById("browser-offset").value, 10) || 0));
  });
  const step = () => parseInt(document.getElementById("browser-limit").value, 10) || 20;
  document.getElementById("browser-prev").addEventListener("click", () =>
    setHash(state.topic, Math.max(0, state.offset - step())));
  document.getElementById("browser-next").addEventListener("click", () =>
    setHash(state.topic, state.offset + step()));
  document.getElementById("browser-close").addEventListener("click", () => {
    history.replaceState(null, "", location.pathname);
    readHash();
  });
}

function schedule() {
  clearInterval(state.timer);
  if (document.getElementById("auto-refresh").checked) state.timer = setInterval(refresh, REFRESH_MS);
}

wireBrowser();
document.getElementById("auto-refresh").addEventListener("change", schedule);
refresh();
schedule();
readHash();
