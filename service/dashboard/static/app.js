// Frenzy dashboard: reads the REST API with the user's token, redraws every 2 s.
"use strict";

const REFRESH_MS = 2000;
const LIVE = ["placed", "starting", "running", "resizing"];
const MEMORY_PARTS = [
  ["parameters", "#2f7de1"], ["gradients", "#7fb2f0"], ["optimizer_states", "#f0a33a"],
  ["activations", "#3aa76d"], ["logits", "#b35fd0"], ["transient", "#e06666"],
  ["overhead", "#9aa0a6"],
];

function token() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    localStorage.setItem("frenzy-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname);
  }
  return localStorage.getItem("frenzy-token");
}

async function api(path) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + token() } });
  if (r.status === 401) { showAuth(); throw new Error("unauthorised"); }
  if (!r.ok) { const e = new Error(path + ": " + r.status); e.status = r.status; throw e; }
  return r.json();
}

function showAuth() {
  document.getElementById("auth").classList.remove("hidden");
  document.getElementById("main").classList.add("hidden");
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "style") e.style.cssText = v; else if (k === "cls") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svgEl(tag, attrs, text) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function colour(jobId) {
  let h = 0;
  for (const ch of jobId) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return `hsl(${h % 360}, 65%, 55%)`;
}

const short = (id) => id.slice(0, 8);
const gib = (b) => (b / 2 ** 30).toFixed(1) + " GiB";
const size = (b) => (b >= 2 ** 30 ? gib(b) : (b / 2 ** 20).toFixed(1) + " MiB");
function dur(s) {
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
const gpuHours = (h) => (h == null ? "-" : h.toFixed(2));
function jobLink(j) { return el("a", { href: "/jobs/" + j.id, title: j.id }, short(j.id)); }
function stateCell(s) { return el("td", { cls: "state state-" + s }, s); }
function progressBar(p) {
  return el("span", {}, el("span", { cls: "bar" },
    el("div", { style: `width:${(100 * p.fraction).toFixed(1)}%` })),
    ` ${(100 * p.fraction).toFixed(0)}% (${Math.floor(p.steps_done)}/${p.total_steps})`);
}
function fill(tbodySel, rows) {
  const tb = document.querySelector(tbodySel);
  tb.replaceChildren(...rows);
}

// -- index page ------------------------------------------------------------------------------
function drawCluster(cluster, jobsById) {
  const box = document.getElementById("cluster");
  const legend = new Map();
  box.replaceChildren(...cluster.nodes.map((n) => {
    const cells = [];
    for (const h of n.holders) {
      if (h.job_id === null) {  // another user's job: its id is not shown
        for (let i = 0; i < h.gpus; i++) {
          cells.push(el("span", { cls: "gpu held", style: "background:#999",
            title: `${n.id}: another user's job` }));
        }
        continue;
      }
      legend.set(h.job_id, jobsById.get(h.job_id));
      for (let i = 0; i < h.gpus; i++) {
        cells.push(el("span", { cls: "gpu held", style: `background:${colour(h.job_id)}`,
          title: `${n.id}: job ${h.job_id}`, "data-job": h.job_id }));
      }
    }
    while (cells.length < n.total_gpus) {
      cells.push(el("span", { cls: "gpu free", title: `${n.id}: free` }));
    }
    return el("div", { cls: "node", "data-node": n.id }, el("span", { cls: "name" }, n.id),
      el("span", { cls: "type" }, n.gpu_type), el("span", {}, ...cells));
  }));
  document.getElementById("cluster-summary").textContent =
    `${cluster.used_gpus}/${cluster.total_gpus} GPUs in use on ${cluster.nodes.length} nodes`;
  document.getElementById("legend").replaceChildren(...[...legend].flatMap(([id, j]) => [
    el("span", { cls: "sw", style: `background:${colour(id)}` }),
    el("a", { href: "/jobs/" + id }, (j ? j.model_name + " " : "") + short(id)),
  ]));
}

function drawUtilisation(stats) {
  const box = document.getElementById("util");
  if (!stats) { box.replaceChildren(el("p", { cls: "muted" }, "needs an admin token")); return; }
  const W = 560, H = 190, L = 40, B = 24, T = 8, R = 110;
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: "util-chart" });
  const n = stats.utilisation.length ? stats.utilisation[0].series.length : 0;
  const x = (i) => L + (n <= 1 ? 0 : (i / (n - 1)) * (W - L - R));
  const y = (f) => T + (1 - f) * (H - T - B);
  for (const f of [0, 0.5, 1]) {
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: y(f), y2: y(f), stroke: "#ddd" }));
    svg.append(svgEl("text", { x: L - 6, y: y(f) + 4, "text-anchor": "end", "font-size": 11 },
      `${f * 100}%`));
  }
  svg.append(svgEl("text", { x: L, y: H - 6, "font-size": 11, fill: "#778" },
    `-${dur(stats.window_s)}`));
  svg.append(svgEl("text", { x: W - R, y: H - 6, "font-size": 11, fill: "#778",
    "text-anchor": "end" }, "now"));
  stats.utilisation.forEach((u, k) => {
    const c = `hsl(${(k * 97) % 360}, 60%, 45%)`;
    const pts = u.series.map((p, i) => `${x(i).toFixed(1)},${y(p.used_fraction).toFixed(1)}`);
    svg.append(svgEl("polyline", { points: pts.join(" "), fill: "none", stroke: c,
      "stroke-width": 2 }));
    svg.append(svgEl("text", { x: W - R + 8, y: T + 14 + 16 * k, "font-size": 12, fill: c },
      `${u.gpu_type} ${(100 * u.mean).toFixed(0)}%`));
  });
  box.replaceChildren(svg);
}

async function refreshIndex() {
  const [cluster, jobs, queue] = await Promise.all([api("/v1/cluster"),
    api("/v1/jobs?limit=200"), api("/v1/cluster/queue")]);
  const why = new Map(queue.data.filter((e) => e.job_id).map((e) => [e.job_id, e.waiting]));
  let stats = null, users = null;
  try {
    [stats, users] = await Promise.all([api("/v1/admin/stats?window_s=600&buckets=30"),
      api("/v1/admin/users")]);
  } catch (e) {
    if (e.status !== 403) throw e;
  }
  const byId = new Map(jobs.data.map((j) => [j.id, j]));
  drawCluster(cluster, byId);
  drawUtilisation(stats);
  const where = new Map(cluster.jobs.map((p) => [p.job_id,
    p.placement.map((x) => `${x.gpus}@${x.node_id}`).join(" + ")]));
  const running = jobs.data.filter((j) => LIVE.includes(j.state));
  const queued = jobs.data.filter((j) => j.state === "pending").reverse();
  const done = jobs.data.filter((j) => !LIVE.includes(j.state) && j.state !== "pending");
  document.getElementById("running-count").textContent = `(${running.length})`;
  document.getElementById("queue-count").textContent =
    `(${stats ? stats.queue_length : queued.length})`;
  fill("#running tbody", running.map((j) => el("tr", { "data-job": j.id },
    el("td", {}, jobLink(j)), el("td", {}, j.owner), el("td", {}, j.model_name),
    stateCell(j.state), el("td", {}, progressBar(j.progress)), el("td", {}, where.get(j.id) || ""))));
  const now = Date.now();
  fill("#queue tbody", queued.slice(0, 50).map((j) => el("tr", { "data-job": j.id },
    el("td", {}, jobLink(j)), el("td", {}, j.owner), el("td", {}, j.model_name),
    el("td", {}, dur((now - Date.parse(j.created_at)) / 1000)),
    el("td", { cls: "muted" }, why.has(j.id) ?
      `[${why.get(j.id).kind}] ${why.get(j.id).message}` : j.state_reason))));
  fill("#finished tbody", done.slice(0, 20).map((j) => el("tr", { "data-job": j.id },
    el("td", {}, jobLink(j)), el("td", {}, j.owner), el("td", {}, j.model_name),
    stateCell(j.state), el("td", {}, j.duration_s == null ? "-" : dur(j.duration_s)),
    el("td", {}, gpuHours(j.gpu_hours)), el("td", { cls: "muted" }, j.state_reason))));
  document.getElementById("users-card").classList.toggle("hidden", !users);
  if (users) {
    fill("#users tbody", users.data.map((u) => el("tr", { "data-owner": u.owner },
      el("td", {}, u.owner), el("td", {}, u.running), el("td", {}, u.queued),
      el("td", {}, u.gpus_held), el("td", {}, gpuHours(u.gpu_hours)), el("td", {}, u.jobs))));
  }
}

// -- job page --------------------------------------------------------------------------------
function drawMemory(plans) {
  const shown = plans.slice(0, 10);
  const W = 620, row = 22, L = 150, R = 70;
  const H = row * shown.length + 24;
  const max = Math.max(...shown.map((p) => p.peak_memory_bytes), 1);
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: "memory-chart" });
  shown.forEach((p, i) => {
    const y0 = 4 + i * row;
    svg.append(svgEl("text", { x: 0, y: y0 + 14, "font-size": 11 },
      `#${p.rank} ${p.num_gpus}x${p.gpu_type} t${p.tp}p${p.pp}d${p.dp}`));
    let x = L;
    for (const [part, c] of MEMORY_PARTS) {
      const w = ((p.memory[part] || 0) / max) * (W - L - R);
      if (w <= 0) continue;
      const r = svgEl("rect", { x, y: y0, width: w, height: row - 6, fill: c });
      r.append(svgEl("title", {}, `${part}: ${gib(p.memory[part])}`));
      svg.append(r);
      x += w;
    }
    svg.append(svgEl("text", { x: x + 6, y: y0 + 14, "font-size": 11 }, gib(p.peak_memory_bytes)));
  });
  document.getElementById("memory").replaceChildren(svg);
  document.getElementById("memory-legend").replaceChildren(...MEMORY_PARTS.flatMap(([p, c]) => [
    el("span", { cls: "sw", style: `background:${c}` }), p.replace("_", " "),
  ]));
}

function drawLoss(metrics) {
  const box = document.getElementById("loss");
  const latest = document.getElementById("metrics-latest");
  const ws = metrics ? metrics.windows.filter((w) => w.loss !== null && w.step !== null) : [];
  if (!ws.length) {
    box.replaceChildren(el("p", { cls: "muted" }, "no training report yet"));
    latest.textContent = "";
    return;
  }
  const W = 560, H = 170, L = 52, B = 24, T = 8, R = 12;
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: "loss-chart" });
  const s0 = ws[0].step, s1 = ws[ws.length - 1].step;
  let lo = Math.min(...ws.map((w) => w.loss)), hi = Math.max(...ws.map((w) => w.loss));
  if (hi === lo) { hi += 0.5; lo -= 0.5; }
  const x = (s) => L + (s1 === s0 ? 0 : ((s - s0) / (s1 - s0)) * (W - L - R));
  const y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
  for (const v of [lo, (lo + hi) / 2, hi]) {
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#ddd" }));
    svg.append(svgEl("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11 },
      v.toFixed(3)));
  }
  svg.append(svgEl("text", { x: L, y: H - 6, "font-size": 11, fill: "#778" }, `step ${s0}`));
  svg.append(svgEl("text", { x: W - R, y: H - 6, "font-size": 11, fill: "#778",
    "text-anchor": "end" }, `step ${s1}`));
  svg.append(svgEl("polyline", { points: ws.map((w) => `${x(w.step).toFixed(1)},` +
    `${y(w.loss).toFixed(1)}`).join(" "), fill: "none", stroke: "#3366cc", "stroke-width": 2 }));
  box.replaceChildren(svg);
  const w = metrics.latest, f = (v, d, u) => (v === null ? "–" : v.toFixed(d) + (u || ""));
  latest.textContent = `step ${w.step}: loss ${f(w.loss, 4)}; ` +
    `${w.tokens_per_s === null ? "–" : Math.round(w.tokens_per_s).toLocaleString()} tokens/s; ` +
    `step ${f(w.step_time_s, 3, " s")} (predicted ${f(w.predicted_step_time_s, 3, " s")})` +
    (w.memory_bytes === null ? "" : `; memory ${size(w.memory_bytes)} (predicted ` +
      `${w.predicted_memory_bytes === null ? "–" : size(w.predicted_memory_bytes)})`);
}

function memoryLine(m) {
  if (!m) return "";
  const parts = [];
  if (m.measured_tensors_bytes !== null) {
    parts.push(`memory per rank: measured ${size(m.measured_tensors_bytes)} (${m.source}), ` +
      `predicted ${m.predicted_tensors_bytes === null ? "–" : size(m.predicted_tensors_bytes)}` +
      (m.error_pct === null ? "" : ` (${m.error_pct >= 0 ? "+" : ""}${m.error_pct.toFixed(1)} %)`));
  }
  if (m.out_of_memory_runs) {
    parts.push(`${m.out_of_memory_runs} out-of-memory run(s), memory ×${m.memory_factor.toFixed(2)} ` +
      `since: ${m.last_out_of_memory}`);
  }
  return parts.join("; ");
}

function drawPair(boxId, metrics, key, predictedKey, fmt, title) {
  // a measured series beside the plan's prediction, per step window
  const box = document.getElementById(boxId);
  const ws = metrics ? metrics.windows.filter((w) => w.step !== null && w[key] !== null) : [];
  if (!ws.length) {
    box.replaceChildren();
    return;
  }
  const W = 560, H = 120, L = 70, B = 20, T = 16, R = 12;
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: boxId + "-svg" });
  const vals = ws.flatMap((w) => [w[key], w[predictedKey]]).filter((v) => v !== null);
  let lo = Math.min(...vals), hi = Math.max(...vals);
  if (hi === lo) { hi *= 1.1; lo *= 0.9; }
  if (hi === lo) { hi += 1; }
  const s0 = ws[0].step, s1 = ws[ws.length - 1].step;
  const x = (st) => L + (s1 === s0 ? 0 : ((st - s0) / (s1 - s0)) * (W - L - R));
  const y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
  for (const v of [lo, hi]) {
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#ddd" }));
    svg.append(svgEl("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11 },
      fmt(v)));
  }
  svg.append(svgEl("text", { x: L, y: 11, "font-size": 11, fill: "#556" },
    `${title}: measured (blue) vs predicted (grey, dashed)`));
  const line = (k, attrs) => {
    const pts = ws.filter((w) => w[k] !== null);
    if (pts.length) {
      svg.append(svgEl("polyline", { points: pts.map((w) => `${x(w.step).toFixed(1)},` +
        `${y(w[k]).toFixed(1)}`).join(" "), fill: "none", ...attrs }));
    }
  };
  line(predictedKey, { stroke: "#999", "stroke-width": 1.5, "stroke-dasharray": "4 3" });
  line(key, { stroke: "#3366cc", "stroke-width": 2 });
  box.replaceChildren(svg);
}

async function refreshJob() {
  const id = location.pathname.split("/").pop();
  document.getElementById("job-id").textContent = short(id);
  const [job, events] = await Promise.all([api(`/v1/jobs/${id}?plans=all`),
    api(`/v1/jobs/${id}/events?limit=200`)]);
  document.getElementById("job-title").textContent =
    `${job.name || job.model_name} — ${job.model.num_params ?
      (job.model.num_params / 1e6).toFixed(1) + "M params" : ""}`;
  const where = job.allocation.map((a) => `${a.gpus}×${a.gpu_type}@${a.node_id}`).join(" + ");
  document.getElementById("job-summary").replaceChildren(
    el("p", {}, el("span", { cls: "state state-" + job.state }, job.state), " — ",
      job.state_reason),
    el("p", {}, progressBar(job.progress)),
    el("p", { id: "waiting" }, job.waiting ?
      `waiting [${job.waiting.kind}]: ${job.waiting.message}` : ""),
    el("p", { id: "job-memory" }, memoryLine(job.memory)),
    el("p", {}, `owner ${job.owner}; batch ${job.training.global_batch} × ` +
      `${job.training.seq_len} tokens, ${job.training.precision}; ` +
      (job.chosen_plan ? `running plan #${job.chosen_plan.rank}` : "no plan chosen yet") +
      (where ? ` on ${where}` : "")),
    el("p", { id: "usage" }, job.gpu_hours == null ? "" :
      (job.duration_s == null ? "" : `ran ${dur(job.duration_s)}; `) +
      `${gpuHours(job.gpu_hours)} GPU-h`));
  drawLoss(job.metrics);
  drawPair("step-chart", job.metrics, "step_time_s", "predicted_step_time_s",
    (v) => v.toFixed(3) + " s", "step time");
  drawPair("mem-chart", job.metrics, "memory_bytes", "predicted_memory_bytes",
    size, "tensor memory per rank");
  drawMemory(job.plans);
  fill("#plans tbody", job.plans.map((p) => el("tr",
    { style: job.chosen_plan && p.rank === job.chosen_plan.rank ? "background:#eef5ff" : "" },
    el("td", {}, p.rank), el("td", {}, `${p.num_gpus}×${p.gpu_type}`), el("td", {}, p.tp),
    el("td", {}, p.pp), el("td", {}, p.dp), el("td", {}, p.micro_batch),
    el("td", {}, p.recompute), el("td", {}, p.zero_stage),
    el("td", {}, gib(p.peak_memory_bytes)), el("td", {}, p.step_time_s.toFixed(3) + " s"),
    el("td", {}, dur(p.job_time_s)), el("td", {}, (p.gpu_seconds / 3600).toFixed(2)))));
  document.getElementById("events").replaceChildren(...events.data.map((e) => el("li", {},
    `${new Date(e.at).toLocaleTimeString()} ${e.kind}: ${e.message}`)));
}

async function tick() {
  const page = document.body.dataset.page;
  try {
    await (page === "job" ? refreshJob() : refreshIndex());
    document.getElementById("status").textContent =
      "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("status").textContent = "error: " + e.message;
  }
}

document.getElementById("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  localStorage.setItem("frenzy-token", document.getElementById("token-input").value.trim());
  location.reload();
});
if (token()) { tick(); setInterval(tick, REFRESH_MS); } else { showAuth(); }
