// The status page: polls /api/v1/status and redraws. No framework, no external assets: the page works offline.
"use strict";

const REFRESH_MS = 2000;
const MFU_LOW = 0.25;  // the guide's sub-25% stall line; "good" is the job's own baseline, not a fixed figure

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const pct = (r, digits = 1) => (r === null || r === undefined) ? "–" : (100 * r).toFixed(digits) + "%";
const num = (v, digits = 0) => (v === null || v === undefined) ? "–" : Number(v).toLocaleString(undefined, {maximumFractionDigits: digits});
const si = (v, unit) => {
  if (v === null || v === undefined) return "–";
  const steps = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [scale, prefix] of steps) if (Math.abs(v) >= scale) return (v / scale).toFixed(2) + " " + prefix + unit;
  return Number(v).toFixed(1) + " " + unit;
};
const duration = (s) => {
  if (s === null || s === undefined) return "–";
  if (s >= 2 * 86400) return (s / 86400).toFixed(1) + " d";
  if (s >= 3600) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " m";
  if (s >= 60) return Math.floor(s / 60) + " m " + Math.floor(s % 60) + " s";
  return s.toFixed(0) + " s";
};
// Red under the guide's 25% line; amber while the attribution books a gap below the job's own baseline (any cause
// but "none"); green otherwise. A fixed "good" line would colour a job amber that runs at its healthy 43%.
const mfuClass = (r, bottleneck) => {
  if (r === null || r === undefined) return "muted";
  if (r < MFU_LOW) return "bad";
  const cause = bottleneck && bottleneck.cause;
  return cause && cause !== "none" ? "warn" : "good";
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

// The job's headline: its MFU, else the hardware estimate (GPM tensor activity × clock, or utilization) that the
// fleet rules use for a job that reports nothing, labelled as such.
const headline = (job) => job.mfu != null
  ? {value: job.mfu, kind: "mfu", label: ""}
  : {value: (job.hardware || {}).headline ?? null, kind: "hardware", label: "hardware estimate"};

// points: [time, MFU, tokens/s, hardware estimate]; the chart draws what the headline shows.
function chart(points, kind, baseline) {
  const w = 600, h = 110, top = 0.7;  // y axis 0–70%
  const column = kind === "mfu" ? 1 : 3;
  const values = points.filter((p) => p[column] !== null && p[column] !== undefined);
  if (points.length < 2) return '<p class="muted">chart: collecting history…</p>';
  if (values.length < 2) return `<p class="muted">chart: no ${kind === "mfu" ? "MFU" : "MFU or hardware figure"} in the last ${duration(points[points.length - 1][0] - points[0][0])}</p>`;
  const t0 = points[0][0], t1 = points[points.length - 1][0], span = Math.max(t1 - t0, 1);
  const x = (t) => ((t - t0) / span) * w;
  const y = (r) => h - (Math.min(r, top) / top) * h;
  const path = values.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + "," + y(p[column]).toFixed(1)).join(" ");
  const what = kind === "mfu" ? "MFU" : "hardware estimate";
  const base = baseline == null ? "" : `<line class="ref high" x1="0" x2="${w}" y1="${y(baseline)}" y2="${y(baseline)}"/><text x="2" y="${y(baseline) - 2}">baseline ${pct(baseline, 0)}</text>`;
  return `<svg class="chart" data-kind="${kind}" viewBox="0 0 ${w} ${h}" role="img" aria-label="${what} over the last ${Math.round(span / 60)} minutes">
    ${base}
    <line class="ref low" x1="0" x2="${w}" y1="${y(MFU_LOW)}" y2="${y(MFU_LOW)}"/><text x="2" y="${y(MFU_LOW) - 2}">25% stall line (the guide)</text>
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

function jobCard(job, history) {
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
  const cause = job.bottleneck && job.bottleneck.cause && job.bottleneck.cause !== "none"
    ? `<div class="cause" data-cause="${esc(job.bottleneck.cause)}"><b>Why ${job.bottleneck.signal && job.bottleneck.signal !== "mfu" ? "utilization" : "MFU"} is low: ${esc(job.bottleneck.cause)}</b><br>${esc(job.bottleneck.evidence || "")}</div>` : "";
  return `<div class="card" data-job="${esc(job.job)}">
    <h3>${esc(job.job)}</h3>
    <div class="mfu ${mfuClass(head.value, job.bottleneck)}" data-headline="${head.kind}" data-mfu="${job.mfu ?? ""}">${pct(head.value)}${head.label ? ` <small class="muted">${head.label}</small>` : ""}</div>
    ${job.reason ? `<div class="muted" data-reason>${esc(job.reason)}</div>` : ""}
    ${cause}
    <dl class="facts">${facts.map(([k, field, value, text]) => `<dt>${k}</dt><dd data-field="${field}" data-value="${esc(JSON.stringify(value ?? null))}">${text}</dd>`).join("")}</dl>
    ${chart(history || [], head.kind, job.bottleneck ? job.bottleneck.baseline_mfu : null)}
    ${timeline(job.ledger, job.data_wait)}
  </div>`;
}

function table(rows, columns) {
  if (!rows.length) return '<p class="muted">nothing to show</p>';
  const head = columns.map((c) => `<th>${esc(c[0])}</th>`).join("");
  const body = rows.map((r) => "<tr>" + columns.map((c) => `<td class="${c[2] || ""}">${c[1](r)}</td>`).join("") + "</tr>").join("");
  return `<div class="scroll"><table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table></div>`;
}

const sum = (o) => Object.values(o || {}).reduce((a, b) => a + (Number(b) || 0), 0);
const max = (o) => Object.values(o || {}).reduce((a, b) => Math.max(a, Number(b) || 0), 0);

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
    ["rate", (r) => r.port.rate_gbps ? r.port.rate_gbps + " Gb/s" : "–", "num"],
    ["rx", (r) => si(r.port.receive_bytes_per_second, "B/s"), "num"],
    ["tx", (r) => si(r.port.transmit_bytes_per_second, "B/s"), "num"],
    ["pause ratio", (r) => r.nic.pause_ratio ? pct(max(r.nic.pause_ratio), 2) : "–", "num"],
    ["pause frames/s", (r) => r.nic.pause_frame_rates ? num(sum(r.nic.pause_frame_rates), 1) : "–", "num"],
    ["CNP/s", (r) => r.port.congestion_rates ? num((r.port.congestion_rates.np_cnp_sent || 0) + (r.port.congestion_rates.rp_cnp_handled || 0), 1) : "–", "num"],
    ["storm events", (r) => r.nic.storm_event_deltas ? num(sum(r.nic.storm_event_deltas)) : "–", "num"],
    ["errors", (r) => num(sum(r.port.error_deltas) + sum(r.nic.error_deltas)), "num"],
  ]);
}

const bar = (r) => r === null || r === undefined ? "–" : `<span class="bar" style="width:${Math.round(60 * Math.min(r, 1))}px"></span>${pct(r, 0)}`;

function render(status) {
  document.getElementById("version").textContent = status.version || "";
  // The wall clock of this refresh, not status.time: that is the exporter's clock, which the demo runs fast.
  const updated = document.getElementById("updated"), now = new Date();
  updated.textContent = "updated " + now.toLocaleTimeString();
  updated.dataset.time = String(now.getTime() / 1000);
  const sources = Object.fromEntries(status.sources.map((s) => [s.source, s]));
  const jobs = document.getElementById("jobs");
  jobs.innerHTML = status.jobs.length
    ? status.jobs.map((j) => jobCard(j, (status.history || {})[j.job])).join("")
    : '<p class="muted">No job has reported progress or been found yet. See the README: <code>ProgressReporter.update(tokens_total=…)</code>.</p>';

  const gpu = sources.gpu;
  const gpus = gpu && gpu.status && gpu.status.gpus ? Object.values(gpu.status.gpus) : [];
  document.getElementById("gpus").innerHTML = gpu && !gpu.up && !gpus.length
    ? `<p class="muted">GPU source down: ${esc(gpu.reason)} ${esc(gpu.detail)}</p>`
    : table(gpus, [
      ["GPU", (g) => esc(g.index)], ["name", (g) => esc(g.name)],
      ["state", (g) => g.up === false ? '<span class="chip down">lost</span>' : '<span class="chip up">up</span>'],
      ["health", healthCell, "wrap"],
      ["utilization", (g) => bar(g.utilization)], ["tensor active", (g) => bar(g.tensor_active)],
      ["SM clock", (g) => si(g.sm_clock_hz, "Hz"), "num"], ["temp", (g) => g.temperature_celsius == null ? "–" : g.temperature_celsius + " °C", "num"],
      ["power", (g) => g.power_watts == null ? "–" : num(g.power_watts) + " W", "num"],
      ["throttle", (g) => esc((g.throttle || []).join(", ")) || "–", "wrap"],
    ]) + (gpu && gpu.status && gpu.status.notes ? gpu.status.notes.map((n) => `<p class="muted">${esc(n)}</p>`).join("") : "");

  document.getElementById("nics").innerHTML = fabricTable(sources.rdma, sources.ethtool);

  document.getElementById("sources").innerHTML = table(status.sources, [
    ["source", (s) => esc(s.source)],
    ["state", (s) => s.up ? '<span class="chip up">up</span>' : '<span class="chip down">down</span>'],
    ["reason", (s) => esc([s.reason, s.detail].filter(Boolean).join(": "))],
    ["last sample", (s) => s.last_sample_duration_seconds == null ? "–" : (1000 * s.last_sample_duration_seconds).toFixed(1) + " ms", "num"],
    ["age", (s) => s.sample_age_seconds == null ? "–" : s.sample_age_seconds.toFixed(1) + " s", "num"],
  ]);

  // The logs source's files: what was detected in each, and why a detected format reads nothing.
  const logs = sources.logs;
  const files = logs && logs.status && logs.status.files ? logs.status.files : [];
  document.getElementById("logs").innerHTML = table(files, [
    ["file", (f) => esc(f.path)], ["job", (f) => esc(f.job)],
    ["format", (f) => esc((f.formats && f.formats.length ? f.formats.join("+") : f.format) || "–")],
    ["lines", (f) => num(f.lines), "num"], ["progress lines", (f) => num(f.progress_lines || 0), "num"],
    ["state", (f) => f.no_progress || f.unrecognised
      ? `<span class="chip down">no progress</span> ${esc(f.no_progress || f.unrecognised)}`
      : '<span class="chip up">reading</span>'],
  ]);
}

async function refresh() {
  try {
    const response = await fetch("api/v1/status", {cache: "no-store"});
    if (!response.ok) throw new Error(response.status + " " + response.statusText);
    render(await response.json());
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    // How far the page runs wider than the window (0: no sideways scrolling), for the browser test at 800 px.
    document.body.dataset.overflowX = String(document.documentElement.scrollWidth - document.documentElement.clientWidth);
  } catch (err) {
    document.getElementById("updated").textContent = "update failed: " + err.message;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
