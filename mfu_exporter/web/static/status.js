// The status page: polls /api/v1/status and redraws. No framework, no external assets: the page works offline.
"use strict";

const REFRESH_MS = 2000;
const MFU_LOW = 0.25;  // the guide's sub-25% stall line; "good" is the job's own baseline, not a fixed figure

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));

// One number format everywhere: commas group thousands, a point marks decimals (whatever the browser's locale, so a
// figure reads the same on every screen and beside the API's), and each kind of quantity keeps a fixed number of
// decimals: percentages 1, SI-scaled figures 2, per-second event rates 1, counts 0.
const fixed = (v, digits) => Number(v).toLocaleString("en-US", {minimumFractionDigits: digits, maximumFractionDigits: digits});
const missing = (v) => v === null || v === undefined || !Number.isFinite(Number(v));
const pct = (r) => missing(r) ? "–" : fixed(100 * r, 1) + "%";
const num = (v, digits = 0) => missing(v) ? "–" : fixed(v, digits);
const si = (v, unit) => {
  if (missing(v)) return "–";
  const steps = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [scale, prefix] of steps) if (Math.abs(v) >= scale) return fixed(v / scale, 2) + " " + prefix + unit;
  return fixed(v, 2) + (unit ? " " + unit : "");
};
// Durations: seconds with one decimal under a minute, whole minutes and seconds, hours and minutes, then days.
const duration = (s) => {
  if (missing(s)) return "–";
  if (s >= 2 * 86400) return fixed(s / 86400, 1) + " d";
  if (s >= 3600) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " m";
  if (s >= 60) return Math.floor(s / 60) + " m " + Math.floor(s % 60) + " s";
  return fixed(Math.max(s, 0), 1) + " s";
};
// Red under the guide's 25% line; amber while the attribution books a gap below the job's own baseline (any cause
// but "none"); green otherwise. A fixed "good" line would colour a job amber that runs at its healthy 43%.
const mfuClass = (r, bottleneck) => {
  if (missing(r)) return "muted";
  if (r < MFU_LOW) return "bad";
  const cause = bottleneck && bottleneck.cause;
  return cause && cause !== "none" ? "warn" : "good";
};

// What the hardware estimate is made of: the first figure the GPUs have, as HardwareFigures.headline() picks it.
const hardwareWhat = (hw) => {
  const over = `mean over its ${hw.gpus_read || "?"} GPU${hw.gpus_read === 1 ? "" : "s"} here`;
  if (!missing(hw.hardware_flops_utilization)) return `tensor-core activity × SM clock ÷ reference clock, ${over}; all tensor work counts, so it reads above MFU`;
  if (!missing(hw.tensor_active)) return `the share of time the tensor cores were busy, ${over}; not FLOPs`;
  return `the share of time any kernel ran (NVML utilization), ${over}; not FLOPs`;
};

// A GPU's health (mfu_gpu_health): its state, what to do (the hover, and the notes under the table), and the last
// Xid with its own state.
const HEALTH_CHIP = {healthy: "up", degraded: "warn"};
function healthCell(g) {
  const h = g.health;
  if (!h) return "–";
  const last = h.last_xid ? ` <span class="muted" title="${esc(h.last_xid.state + ": " + h.last_xid.action)}">Xid ${esc(h.last_xid.code)}</span>` : "";
  return `<span class="chip ${HEALTH_CHIP[h.state] || "down"}" title="${esc(h.action)}">${esc(h.state)}</span>${last}`;
}

// The job's headline: its MFU by the formula, else the hardware estimate (GPM tensor activity × clock, or
// utilization) that the fleet rules use for a job that reports nothing. Each is named, with what it means, and the
// estimate is set smaller: the two are never the same figure in the same type.
const headline = (job) => {
  const hw = job.hardware || {};
  const window = job.window_seconds ? ` over the last ${duration(job.window_seconds)}` : "";
  if (job.mfu != null || hw.headline == null) return {
    value: job.mfu ?? null, kind: "mfu", label: "MFU, by the formula",
    what: `model FLOPs per token × tokens/s ÷ the peak FLOP/s of the job's GPUs${window}`,
  };
  return {value: hw.headline, kind: "hardware", label: "Hardware estimate, not MFU", what: hardwareWhat(hw)};
};

// A time-axis step that gives at most six ticks over ``span`` seconds.
const TIME_STEPS = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
const timeStep = (span) => TIME_STEPS.find((s) => span / s <= 6) ?? Math.ceil(span / 6 / 86400) * 86400;
// How long before now a tick is, every tick of an axis in the unit of its step: hours, minutes or seconds.
const ago = (s, step) => s === 0 ? "now" : "−" + (step % 3600 === 0 ? s / 3600 + " h" : step % 60 === 0 ? s / 60 + " m" : s + " s");

// points: [time, MFU, tokens/s, hardware estimate] on the exporter's clock; ``now`` is that clock's time of the
// answer. The chart draws what the headline shows, against the job's baseline and the 25% line, on a scale from 0
// to the highest of 60%, the data and the baseline, rounded up to a whole tick: it never clips a figure.
function chart(points, kind, baseline, now) {
  const W = 600, H = 160, left = 44, right = 10, top = 10, bottom = 24;
  const pw = W - left - right, ph = H - top - bottom;
  const column = kind === "mfu" ? 1 : 3;
  const values = points.filter((p) => !missing(p[column]));
  if (points.length < 2) return '<p class="muted">chart: collecting history…</p>';
  if (values.length < 2) return `<p class="muted">chart: no ${kind === "mfu" ? "MFU" : "MFU or hardware figure"} in the last ${duration(points[points.length - 1][0] - points[0][0])}</p>`;
  const highest = Math.max(0.6, missing(baseline) ? 0 : baseline, ...values.map((p) => p[column]));
  const step = highest > 0.6 ? 0.2 : 0.1;
  const ceiling = Math.ceil(highest / step - 1e-9) * step;
  const t0 = points[0][0], t1 = Math.max(missing(now) ? 0 : now, points[points.length - 1][0]), span = Math.max(t1 - t0, 1);
  const x = (t) => left + ((t - t0) / span) * pw;
  const y = (r) => top + ph - (Math.max(r, 0) / ceiling) * ph;
  const yTicks = [];
  for (let i = 0; i * step <= ceiling + 1e-9; i++) {
    const r = i * step, at = y(r).toFixed(1);
    yTicks.push(`<line class="grid" x1="${left}" x2="${W - right}" y1="${at}" y2="${at}"/><text class="tick" data-axis="y" data-value="${r.toFixed(2)}" x="${left - 5}" y="${at}" text-anchor="end" dominant-baseline="middle">${Math.round(100 * r)}%</text>`);
  }
  const every = timeStep(span), xTicks = [];
  for (let back = 0; back <= span + 1e-9; back += every) {
    if (back > 0 && x(t1 - back) < left + 20) continue;  // its label would run into the percent axis
    const at = x(t1 - back).toFixed(1);
    xTicks.push(`<line class="grid" x1="${at}" x2="${at}" y1="${top}" y2="${top + ph}"/><text class="tick" data-axis="x" data-seconds="${back}" x="${at}" y="${H - 6}" text-anchor="${back === 0 ? "end" : "middle"}">${ago(back, every)}</text>`);
  }
  const path = values.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + "," + y(p[column]).toFixed(1)).join(" ");
  const what = kind === "mfu" ? "MFU" : "hardware estimate";
  const base = missing(baseline) ? "" : `<line class="ref high" data-ref="baseline" data-value="${baseline}" x1="${left}" x2="${W - right}" y1="${y(baseline).toFixed(1)}" y2="${y(baseline).toFixed(1)}"/><text class="ref-label" x="${W - right - 2}" y="${(y(baseline) - 3).toFixed(1)}" text-anchor="end">baseline ${pct(baseline)}</text>`;
  return `<svg class="chart" data-kind="${kind}" data-top="${ceiling.toFixed(2)}" viewBox="0 0 ${W} ${H}" role="img" aria-label="${what} over the last ${duration(span)}, 0 to ${Math.round(100 * ceiling)}%">
    <g class="axes">${yTicks.join("")}${xTicks.join("")}<line class="axis" x1="${left}" x2="${left}" y1="${top}" y2="${top + ph}"/><line class="axis" x1="${left}" x2="${W - right}" y1="${top + ph}" y2="${top + ph}"/></g>
    ${base}
    <line class="ref low" data-ref="low" data-value="${MFU_LOW}" x1="${left}" x2="${W - right}" y1="${y(MFU_LOW).toFixed(1)}" y2="${y(MFU_LOW).toFixed(1)}"/><text class="ref-label" x="${W - right - 2}" y="${(y(MFU_LOW) + 12).toFixed(1)}" text-anchor="end">25% stall line (the guide)</text>
    <path class="line" d="${path}"/></svg>`;
}

// "gpus" is what the job said: a count, or the list of its GPUs (indices or UUIDs); the page shows how many.
const gpuCount = (g) => Array.isArray(g) ? g.length : g;

// The job's run timeline from its time ledger: one row per run, each band coloured by where its time went.
const KINDS = ["productive", "wasted", "startup", "checkpoint_save", "checkpoint_load", "down", "stalled"];

function timeline(ledger, dataWait) {
  if (!ledger || !ledger.bands || !ledger.bands.length) return "";
  const bands = ledger.bands, runs = [...new Set(bands.map((b) => b.run))];
  const w = 600, row = 14, gap = 4, label = 46, h = runs.length * (row + gap);
  const t0 = bands[0].start, t1 = Math.max(...bands.map((b) => b.end)), span = Math.max(t1 - t0, 1);
  const x = (t) => label + ((t - t0) / span) * (w - label);
  const rects = bands.map((b) => {
    const y = runs.indexOf(b.run) * (row + gap);
    const width = Math.max(x(b.end) - x(b.start), 2);  // a short band (a crash before the first step) stays visible
    return `<rect class="band ${esc(b.kind)}" data-run="${b.run}" data-kind="${esc(b.kind)}" x="${x(b.start).toFixed(1)}" y="${y}" width="${width.toFixed(1)}" height="${row}"><title>run ${b.run}: ${esc(b.kind)} ${duration(b.end - b.start)}</title></rect>`;
  }).join("");
  const labels = runs.map((r, i) => `<text x="0" y="${i * (row + gap) + row - 3}">run ${r}</text>`).join("");
  const totals = KINDS.filter((k) => ledger.seconds && ledger.seconds[k] > 0)
    .map((k) => `<span class="key ${k}">${k.replace("_", " ")} ${duration(ledger.seconds[k])}</span>`).join(" ");
  // Data wait is inside productive (steps still advance), shown beside the kinds.
  const productive = ledger.kinds && ledger.kinds.productive;
  const share = dataWait && productive > 0 ? Math.min(dataWait.gpu_seconds_total / productive, 1) : null;
  const wait = share != null ? ` · <span class="key data-wait" data-share="${share}">data wait ${pct(share)} of productive</span>` : "";
  return `<div class="timeline" data-goodput="${ledger.goodput ?? ""}" data-runs="${runs.length}">
    <div class="muted">goodput ${pct(ledger.goodput)} · ${runs.length} run${runs.length === 1 ? "" : "s"} · ${totals}${wait}</div>
    <svg class="runs" viewBox="0 0 ${w} ${h}" role="img" aria-label="runs of the job over ${duration(span)}">${labels}${rects}</svg>
  </div>`;
}

// How long the job's cause has held, on the exporter's clock (``now`` is that clock's time of the answer, so the
// demo's fast clock reads right too); the moment itself is in the element's datetime and title.
function since(bottleneck, now) {
  if (missing(bottleneck.since)) return "";
  const at = new Date(bottleneck.since * 1000);
  const held = missing(now) ? "" : `for ${duration(Math.max(now - bottleneck.since, 0))}`;
  return ` <time class="since" datetime="${at.toISOString()}" data-since="${bottleneck.since}" title="since ${esc(at.toLocaleString())} (the exporter's clock)">${held || "since " + esc(at.toLocaleTimeString())}</time>`;
}

function jobCard(job, history, now) {
  const hw = job.hardware || {}, head = headline(job);
  // [label, the API field shown (a path in the job's JSON), its value, the text]: each <dd> carries the field and
  // the value it was drawn from, so what the page prints can be checked against what the API said.
  const facts = [
    ["tokens/s", "tokens_per_second", job.tokens_per_second, num(job.tokens_per_second)],
    ["tokens", "tokens_total", job.tokens_total, si(job.tokens_total, "")],
    ["step", "step", job.step, num(job.step)],
    // What the job said, else what discovery found: the count mfu_job_gpus exports either way.
    job.gpus != null || !job.discovered
      ? ["GPUs here", "gpus", job.gpus, num(gpuCount(job.gpus))]
      : ["GPUs here", "discovered.gpus", job.discovered.gpus, num(job.discovered.gpus.length)],
    ["peak", "peak_flops", job.peak_flops, si(job.peak_flops, "FLOP/s")],
    ["ETA", "eta_seconds", job.eta_seconds, duration(job.eta_seconds)],
    // The job's own rhythm, learned from its counts: the time between two of them is neither a stall nor a slowdown.
    ["cadence", "cadence_seconds", job.cadence_seconds, job.cadence_seconds != null ? `a count every ${duration(job.cadence_seconds)}, stalled after ${duration(job.stall_after_seconds)}` : "learning (two counts needed)"],
    ["found by", "found_by", job.found_by, esc((job.found_by || []).join(", ") || "—")],
    ["GPU indices", "gpu_indices", job.gpu_indices, esc((job.gpu_indices || []).join(", ") || "—")],
    ["hardware FLOPs", "hardware.hardware_flops_utilization", hw.hardware_flops_utilization, job.hardware ? pct(hw.hardware_flops_utilization) : "—"],
    ["tensor active", "hardware.tensor_active", hw.tensor_active, job.hardware ? pct(hw.tensor_active) : "—"],
  ];
  // The share of wall time the job's loop waited for its next batch, and whose figure it is (client, log:<framework>).
  if (job.data_wait) facts.push(
    ["data wait", "data_wait.ratio", job.data_wait.ratio, job.data_wait.ratio != null ? pct(job.data_wait.ratio) : "—"],
    ["data wait from", "data_wait.source", job.data_wait.source, esc(job.data_wait.source)],
  );
  if (job.bottleneck && job.bottleneck.baseline_from) facts.push(["baseline from", "bottleneck.baseline_from", job.bottleneck.baseline_from, esc(job.bottleneck.baseline_from)]);
  if (job.checkpoint) facts.push(["checkpoint", "checkpoint", job.checkpoint, esc(job.checkpoint.in_progress ? `writing ${job.checkpoint.in_progress} for ${duration(job.checkpoint.elapsed_seconds)}` : (job.checkpoint.last_duration_seconds != null ? `last took ${duration(job.checkpoint.last_duration_seconds)}` : "none yet"))]);
  const b = job.bottleneck;
  const cause = b && b.cause && b.cause !== "none"
    ? `<div class="cause" data-cause="${esc(b.cause)}"><b>Why ${b.signal && b.signal !== "mfu" ? "utilization" : "MFU"} is low: ${esc(b.cause)}</b>${since(b, now)}<br>${esc(b.evidence || "")}</div>` : "";
  return `<div class="card" data-job="${esc(job.job)}">
    <h3>${esc(job.job)}</h3>
    <div class="headline"><div class="headline-label" data-label-for="${head.kind}">${esc(head.label)}</div>
    <div class="mfu ${mfuClass(head.value, job.bottleneck)}" data-headline="${head.kind}" data-mfu="${job.mfu ?? ""}">${pct(head.value)}</div>
    <div class="headline-what muted">${esc(head.what)}</div></div>
    ${job.reason ? `<div class="muted" data-reason>${esc(job.reason)}</div>` : ""}
    ${cause}
    <dl class="facts">${facts.map(([k, field, value, text]) => `<dt>${k}</dt><dd data-field="${field}" data-value="${esc(JSON.stringify(value ?? null))}">${text}</dd>`).join("")}</dl>
    ${chart(history || [], head.kind, b ? b.baseline_mfu : null, now)}
    ${timeline(job.ledger, job.data_wait)}
  </div>`;
}

// A table whose every cell carries its column's name (data-label): when the columns cannot fit the page even with
// their text wrapped, fitTables() stacks each row into "name value" pairs instead, so no column is ever cut off or
// scrolled out of sight, however many columns a table grows.
function table(rows, columns, name) {
  if (!rows.length) return '<p class="muted">nothing to show</p>';
  const head = columns.map((c) => `<th scope="col" class="${c[2] || ""}">${esc(c[0])}</th>`).join("");
  const body = rows.map((r) => "<tr>" + columns.map((c) => `<td class="${c[2] || ""}" data-label="${esc(c[0])}">${c[1](r)}</td>`).join("") + "</tr>").join("");
  return `<div class="table" data-table="${name}"><table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table></div>`;
}

// Each table as a table where it fits its box, else in smaller type where that fits, else stacked. Measured after
// every redraw and on resize.
function fitTables() {
  for (const box of document.querySelectorAll("div.table")) {
    const table = box.querySelector("table"), fits = () => table.getBoundingClientRect().width <= box.clientWidth + 0.5;
    box.classList.remove("compact", "stacked");
    if (fits()) continue;
    box.classList.add("compact");
    if (!fits()) box.classList.replace("compact", "stacked");
  }
  // How far the page runs wider than the window (0: no sideways scrolling).
  document.body.dataset.overflowX = String(document.documentElement.scrollWidth - document.documentElement.clientWidth);
}

const sum = (o) => Object.values(o || {}).reduce((a, b) => a + (Number(b) || 0), 0);
const max = (o) => Object.values(o || {}).reduce((a, b) => Math.max(a, Number(b) || 0), 0);
// A snake_case name may break after each underscore, so a long one wraps in a narrow column.
const breakable = (s) => esc(s).replace(/_/g, "_<wbr>");

// One row per NIC: the RDMA port (sysfs) joined to its netdev's ethtool statistics.
function fabricTable(rdma, eth) {
  const ports = rdma && rdma.status && rdma.status.ports ? rdma.status.ports : [];
  const interfaces = eth && eth.status && eth.status.interfaces ? eth.status.interfaces : [];
  if (!ports.length && !interfaces.length) {
    const why = [rdma, eth].filter((s) => s && !s.up).map((s) => `${s.source}: ${s.reason} ${s.detail || ""}`);
    return `<p class="muted">No RDMA ports or NICs seen${why.length ? " (" + esc(why.join("; ")) + ")" : ""}.</p>`;
  }
  const byNetdev = Object.fromEntries(interfaces.map((i) => [i.interface, i]));
  const rows = ports.map((p) => ({port: p, nic: byNetdev[p.netdev] || {}}));
  const seen = new Set(ports.map((p) => p.netdev));
  for (const nic of interfaces) if (!seen.has(nic.interface)) rows.push({port: {}, nic});
  return table(rows, [
    ["interface", (r) => esc(r.nic.interface || r.port.netdev || "–")],
    ["RDMA port", (r) => r.port.device ? esc(`${r.port.device}/${r.port.port}`) : "–"],
    ["state", (r) => r.port.state ? `<span class="chip ${r.port.state === "ACTIVE" ? "up" : "down"}">${esc(r.port.state)}</span>` : "–"],
    ["rate", (r) => r.port.rate_gbps ? num(r.port.rate_gbps) + " Gb/s" : "–", "num"],
    ["rx", (r) => si(r.port.receive_bytes_per_second, "B/s"), "num"],
    ["tx", (r) => si(r.port.transmit_bytes_per_second, "B/s"), "num"],
    ["pause ratio", (r) => r.nic.pause_ratio ? pct(max(r.nic.pause_ratio)) : "–", "num"],
    ["pause frames/s", (r) => r.nic.pause_frame_rates ? num(sum(r.nic.pause_frame_rates), 1) : "–", "num"],
    ["CNP/s", (r) => r.port.congestion_rates ? num((r.port.congestion_rates.np_cnp_sent || 0) + (r.port.congestion_rates.rp_cnp_handled || 0), 1) : "–", "num"],
    ["storm events", (r) => r.nic.storm_event_deltas ? num(sum(r.nic.storm_event_deltas)) : "–", "num"],
    ["errors", (r) => num(sum(r.port.error_deltas) + sum(r.nic.error_deltas)), "num"],
  ], "fabric");
}

const bar = (r) => missing(r) ? "–" : `<span class="bar" style="--r:${Math.min(Math.max(r, 0), 1).toFixed(3)}"></span>${pct(r)}`;

function render(status) {
  document.getElementById("version").textContent = status.version || "";
  // The wall clock of this refresh, not status.time: that is the exporter's clock, which the demo runs fast.
  const updated = document.getElementById("updated"), now = new Date();
  updated.textContent = "updated " + now.toLocaleTimeString();
  updated.dataset.time = String(now.getTime() / 1000);
  const sources = Object.fromEntries(status.sources.map((s) => [s.source, s]));
  const jobs = document.getElementById("jobs");
  jobs.innerHTML = status.jobs.length
    ? status.jobs.map((j) => jobCard(j, (status.history || {})[j.job], status.time)).join("")
    : '<p class="muted">No job has reported progress or been found yet. See the README: <code>ProgressReporter.update(tokens_total=…)</code>.</p>';

  const gpu = sources.gpu;
  const gpus = gpu && gpu.status && gpu.status.gpus ? Object.values(gpu.status.gpus) : [];
  document.getElementById("gpus").innerHTML = gpu && !gpu.up && !gpus.length
    ? `<p class="muted">GPU source down: ${esc(gpu.reason)} ${esc(gpu.detail)}</p>`
    : table(gpus, [
      ["GPU", (g) => esc(g.index)], ["name", (g) => esc(g.name)],
      ["state", (g) => g.up === false ? '<span class="chip down">lost</span>' : '<span class="chip up">up</span>'],
      ["health", healthCell, "wrap"],
      ["utilization", (g) => bar(g.utilization), "num"], ["tensor active", (g) => bar(g.tensor_active), "num"],
      ["SM clock", (g) => si(g.sm_clock_hz, "Hz"), "num"], ["temp", (g) => missing(g.temperature_celsius) ? "–" : num(g.temperature_celsius) + " °C", "num"],
      ["power", (g) => missing(g.power_watts) ? "–" : num(g.power_watts) + " W", "num"],
      ["throttle", (g) => (g.throttle || []).map(breakable).join(", ") || "–", "wrap"],
    ], "gpus") + (gpu && gpu.status && gpu.status.notes ? gpu.status.notes.map((n) => `<p class="muted">${esc(n)}</p>`).join("") : "");

  document.getElementById("nics").innerHTML = fabricTable(sources.rdma, sources.ethtool);

  document.getElementById("sources").innerHTML = table(status.sources, [
    ["source", (s) => esc(s.source)],
    ["state", (s) => s.up ? '<span class="chip up">up</span>' : '<span class="chip down">down</span>'],
    ["reason", (s) => esc([s.reason, s.detail].filter(Boolean).join(": ")), "wrap"],
    ["last sample", (s) => missing(s.last_sample_duration_seconds) ? "–" : num(1000 * s.last_sample_duration_seconds, 1) + " ms", "num"],
    ["age", (s) => duration(s.sample_age_seconds), "num"],
  ], "sources");

  // The logs source's files: what was detected in each, and why a detected format reads nothing.
  const logs = sources.logs;
  const files = logs && logs.status && logs.status.files ? logs.status.files : [];
  document.getElementById("logs").innerHTML = table(files, [
    ["file", (f) => esc(f.path), "path"], ["job", (f) => esc(f.job)],
    ["format", (f) => esc((f.formats && f.formats.length ? f.formats.join("+") : f.format) || "–")],
    ["lines", (f) => num(f.lines), "num"], ["progress lines", (f) => num(f.progress_lines || 0), "num"],
    ["state", (f) => f.no_progress || f.unrecognised
      ? `<span class="chip down">no progress</span> ${esc(f.no_progress || f.unrecognised)}`
      : '<span class="chip up">reading</span>', "wrap"],
  ], "logs");
  fitTables();
}

async function refresh() {
  try {
    const response = await fetch("api/v1/status", {cache: "no-store"});
    if (!response.ok) throw new Error(response.status + " " + response.statusText);
    render(await response.json());
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (err) {
    document.getElementById("updated").textContent = "update failed: " + err.message;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

window.addEventListener("resize", fitTables);
refresh();
