// evsched dashboard: progressive enhancement of server-rendered pages (charts, live updates).
"use strict";

const STATUS_COLORS = {
  scheduled: "#94a3b8", leased: "#f59e0b", running: "#2563eb",
  succeeded: "#1f8a4c", dead: "#c0392b", cancelled: "#6b7686",
};
const VERDICT_COLORS = {
  applied: "#1f8a4c", duplicate: "#94a3b8", conflict: "#c0392b",
  stale: "#c0392b", rejected: "#c0392b", undecodable: "#c0392b",
};
const PALETTE = ["#2563eb", "#c77d00", "#1f8a4c", "#9333ea", "#c0392b", "#0891b2", "#4b5563"];
const SECOND_MS = 1000;
// Tick intervals of the time axis, in seconds: the first that gives at most TICKS ticks.
const STEPS_S = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
const TICKS = 8;

function readJson(id) {
  const el = document.getElementById(id);
  return el ? JSON.parse(el.textContent) : null;
}

function clock(seconds) {
  return new Date(seconds * 1000).toISOString().slice(11, 19);
}

function setText(id, text) {
  const el = document.getElementById(id);
  if (el) el.textContent = text;
}

function fmt(v) {
  return v === null || v === undefined ? "—" : v.toFixed(3);
}

// --- overview ---------------------------------------------------------------------------------

// The series have a sample per second of log time that saw events, and none for a quiet second.
// So x is the sample's time, not its index: a linear axis of epoch ms (Chart.js's time scale
// needs a date adapter, which is not vendored) with clock labels, on which a quiet minute keeps
// its width. Lines are straight (no tension): they show the samples, not a curve through them.
function timeAxis() {
  return {
    type: "linear", bounds: "data",
    title: { display: true, text: "log time (UTC)" },
    ticks: { maxRotation: 0, callback: (ms) => clock(ms / SECOND_MS) },
  };
}

function timeStepMs(t) {
  const span = t.length > 1 ? t[t.length - 1] - t[0] : 0;
  return (STEPS_S.find((s) => s * TICKS >= span) || STEPS_S[STEPS_S.length - 1]) * SECOND_MS;
}

function timePoints(t, values) {
  return t.map((s, i) => ({ x: s * SECOND_MS, y: values[i] }));
}

function lineChart(canvas, datasets) {
  return new Chart(canvas, {
    type: "line",
    data: { datasets },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false,
      scales: { x: timeAxis(), y: { beginAtZero: true } },
      plugins: { tooltip: { callbacks: { title: (items) =>
        (items.length ? clock(items[0].parsed.x / SECOND_MS) : "") } } },
    },
  });
}

function overviewCharts(data) {
  const common = { animation: false, responsive: true, maintainAspectRatio: false };
  // A quiet second started and finished nothing: the rate lines break there (spanGaps spans at
  // most one second) and a lone busy second shows as a dot.
  const rate = { data: [], pointRadius: 1.5, tension: 0, spanGaps: SECOND_MS };
  const rates = lineChart(document.getElementById("chart-rates"), [
    { ...rate, label: "started/s", borderColor: "#2563eb", backgroundColor: "#2563eb" },
    { ...rate, label: "finished/s", borderColor: "#1f8a4c", backgroundColor: "#1f8a4c" },
  ]);
  const depth = lineChart(document.getElementById("chart-depth"), []);
  const status = new Chart(document.getElementById("chart-status"), {
    type: "bar",
    data: { labels: Object.keys(data.statuses), datasets: [{ label: "jobs", data: [],
      backgroundColor: Object.keys(data.statuses).map((s) => STATUS_COLORS[s]) }] },
    options: { ...common, plugins: { legend: { display: false } } },
  });
  return { rates, depth, status };
}

function updateOverview(charts, data) {
  document.body.dataset.version = data.version;
  setText("total", data.total);
  for (const [s, n] of Object.entries(data.statuses)) setText(`status-${s}`, n);
  for (const [k, n] of Object.entries(data.totals)) setText(`total-${k}`, n);
  for (const [name, ps] of Object.entries(data.percentiles)) {
    setText(`pct-${name}`, Object.entries(ps).map(([p, v]) => `${p} ${fmt(v)}`).join(" · "));
  }
  const t = data.series.t;
  charts.rates.data.datasets[0].data = timePoints(t, data.series.started);
  charts.rates.data.datasets[1].data = timePoints(t, data.series.finished);
  // A queue's depth holds between samples: its line goes straight across a quiet stretch.
  charts.depth.data.datasets = Object.entries(data.series.depth).map(([q, values], i) => ({
    label: q, data: timePoints(t, values), borderColor: PALETTE[i % PALETTE.length],
    pointRadius: 0, tension: 0, spanGaps: true,
  }));
  for (const chart of [charts.rates, charts.depth]) {
    chart.options.scales.x.ticks.stepSize = timeStepMs(t);
  }
  charts.status.data.datasets[0].data = Object.values(data.statuses);
  for (const chart of Object.values(charts)) chart.update();
  updateTables(data);
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    td.textContent = cell;
    tr.appendChild(td);
  }
  return tr;
}

function updateTables(data) {
  const parts = document.querySelector("#partitions tbody");
  parts.replaceChildren(...data.partitions.map((p) =>
    row([p.partition, p.applied_offset, p.lag === null ? "?" : p.lag, p.owner || "—", p.last_decider || "—"])));
  const statuses = Object.keys(data.statuses);
  const queues = document.querySelector("#queues tbody");
  queues.replaceChildren(...Object.entries(data.queues).map(([q, counts]) =>
    row([q, ...statuses.map((s) => counts[s])])));
  const workers = document.getElementById("workers");
  const items = data.workers.map((w) => {
    const li = document.createElement("li");
    li.textContent = w.id;
    return li;
  });
  workers.replaceChildren(...items);
}

function overview() {
  const data = readJson("overview-data");
  const charts = overviewCharts(data);
  updateOverview(charts, data);
  follow(charts);
}

function follow(charts) {
  const source = new EventSource("/live");
  source.onopen = () => setText("live-state", "live");
  source.onerror = () => {
    setText("live-state", "reconnecting");
    // A refused stream (a 503: the API's cap of open streams) is not retried by the browser.
    if (source.readyState === EventSource.CLOSED) setTimeout(() => follow(charts), 10000);
  };
  source.addEventListener("overview", (e) => updateOverview(charts, JSON.parse(e.data)));
}

// --- a job ------------------------------------------------------------------------------------

function timeline() {
  const data = readJson("timeline-data");
  const points = data.points.map((p) => ({ ...p, x: p.x, y: p.y }));
  const canvas = document.getElementById("chart-timeline");
  // A row per token; set through the CSSOM, as the page's CSP allows no inline style attribute.
  canvas.parentElement.style.height = `${70 + 36 * data.rows.length}px`;
  new Chart(canvas, {
    data: {
      datasets: [
        { type: "bar", label: "leased", data: data.leased, backgroundColor: "#fde68a",
          borderSkipped: false, barPercentage: 0.6 },
        { type: "bar", label: "running", data: data.running, backgroundColor: "#93c5fd",
          borderSkipped: false, barPercentage: 0.6, grouped: false },
        { type: "scatter", label: "events", data: points, pointRadius: 6,
          pointStyle: points.map((p) => (p.verdict === "applied" ? "circle" : "crossRot")),
          pointBorderWidth: points.map((p) => (p.verdict === "applied" ? 1 : 3)),
          backgroundColor: points.map((p) => VERDICT_COLORS[p.verdict]),
          borderColor: points.map((p) => VERDICT_COLORS[p.verdict]) },
      ],
    },
    options: {
      animation: false, indexAxis: "y", maintainAspectRatio: false,
      scales: {
        x: { type: "linear", title: { display: true, text: "seconds since the first event" } },
        y: { type: "category", labels: data.rows },
      },
      plugins: { tooltip: { callbacks: { label: (c) => {
        const raw = c.raw;
        if (raw.kind) return `${raw.kind} @${raw.offset}: ${raw.verdict} (${raw.reason})`;
        return `${c.dataset.label} ${raw.x[0]}–${raw.x[1]} s`;
      } } } },
    },
  });
}

function timeTravel() {
  const range = document.getElementById("as-of-range");
  const select = document.getElementById("as-of");
  if (!range || !select) return;
  range.addEventListener("input", () => { select.selectedIndex = Number(range.value); });
  range.addEventListener("change", () => select.form.submit());
  select.addEventListener("change", () => select.form.submit());
}

function selectAll() {
  const all = document.getElementById("select-all");
  if (!all) return;
  all.addEventListener("change", () => {
    for (const box of document.querySelectorAll("input[name=ids]")) box.checked = all.checked;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "overview") overview();
  if (page === "job") { timeline(); timeTravel(); }
  selectAll();
});
