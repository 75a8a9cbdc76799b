"use strict";
// Draws the model `cuhook view` embedded above: one lane per trace, live bytes per series
// (min-max band and last value per bucket), peaks marked, the events of each bucket as a strip
// coloured by API (allocations up, frees down), details on hover. Reports its own outcome in
// #status and body[data-status] ("ok" or "error"), which the tests read.
(function () {
  const statusEl = document.getElementById("status");
  function fail(message) {
    document.body.dataset.status = "error";
    statusEl.dataset.status = "error";
    statusEl.textContent = "cuhook view: script error: " + message;
  }
  window.addEventListener("error", (e) => fail(e.message));

  const API_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#ad494a", "#637939", "#e7ba52"];
  const SERIES_COLORS = { cuda: ["#1f5fbf", "#0b8f8f", "#3a3ad0", "#5b8def"],
    managed: ["#8e44ad", "#b05cc8"], host: ["#e67e22", "#c0392b"], unknown: ["#7f8c8d"] };

  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let u = 0;
    while (n >= 1024 && u + 1 < units.length) { n /= 1024; u++; }
    return u === 0 ? n + " B" : n.toFixed(1) + " " + units[u];
  }
  function when(data, x) {
    if (!data.timed) return "event " + Math.round(x);
    const s = x / 1e9;
    return s >= 1 ? s.toFixed(3) + " s" : (x / 1e6).toFixed(3) + " ms";
  }
  function seriesName(s) {
    return s.mem_type + (s.device >= 0 ? " dev " + s.device : "");
  }
  function seriesColor(s, i) {
    const list = SERIES_COLORS[s.mem_type] || SERIES_COLORS.unknown;
    return list[(Math.max(s.device, 0) + i) % list.length];
  }
  function apiColor(i) { return API_COLORS[i % API_COLORS.length]; }

  function legend(el, items) {
    for (const [name, color] of items) {
      const s = document.createElement("span");
      s.style.setProperty("--c", color);
      s.textContent = name;
      el.appendChild(s);
    }
  }

  const M = { left: 72, right: 12, top: 16, chart: 200, gap: 10, strip: 44, axis: 22 };

  function drawLane(data, lane, canvas) {
    const B = data.buckets;
    const width = canvas.clientWidth || 1000;
    const height = M.top + M.chart + M.gap + M.strip + M.axis;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.height = height + "px";
    const g = canvas.getContext("2d");
    g.scale(dpr, dpr);
    g.font = "11px system-ui, sans-serif";
    const plotW = width - M.left - M.right;
    const bx = (b) => M.left + ((b + 0.5) * plotW) / B;
    let yMax = 1;
    for (const s of lane.series) yMax = Math.max(yMax, s.peak);
    yMax *= 1.12;
    const y = (v) => M.top + M.chart - (v / yMax) * M.chart;

    // Axes and grid.
    g.strokeStyle = "#e3e5ec";
    g.fillStyle = "#555";
    g.textAlign = "right";
    g.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const v = (yMax / 1.12) * (i / 4);
      g.beginPath();
      g.moveTo(M.left, y(v));
      g.lineTo(M.left + plotW, y(v));
      g.stroke();
      g.fillText(bytes(Math.round(v)), M.left - 6, y(v));
    }
    g.textAlign = "center";
    g.textBaseline = "top";
    const axisY = M.top + M.chart + M.gap + M.strip + 4;
    for (let i = 0; i <= 5; i++) {
      const x = M.left + (plotW * i) / 5;
      g.textAlign = i === 0 ? "left" : i === 5 ? "right" : "center";
      g.fillText(when(data, ((data.span + 1) * i) / 5), x, axisY);
    }

    // Live bytes: the band between each bucket's min and max, and a line through its last value.
    const labels = [];
    lane.series.forEach((s, i) => {
      if (s.peak === 0) return; // only frees of unknown pointers: nothing was ever live
      const color = seriesColor(s, i);
      g.fillStyle = color + "40";
      g.beginPath();
      for (let b = 0; b < B; b++) g.lineTo(bx(b), y(s.max[b]));
      for (let b = B - 1; b >= 0; b--) g.lineTo(bx(b), y(s.min[b]));
      g.closePath();
      g.fill();
      g.strokeStyle = color;
      g.lineWidth = 1.5;
      g.beginPath();
      for (let b = 0; b < B; b++) g.lineTo(bx(b), y(s.last[b]));
      g.stroke();
      // The exact peak, at the bucket it was first reached in.
      const pb = Math.floor((s.peak_x * B) / (data.span + 1));
      const px = bx(Math.min(pb, B - 1));
      const py = y(s.peak);
      g.fillStyle = color;
      g.beginPath();
      g.moveTo(px, py - 2);
      g.lineTo(px - 5, py - 10);
      g.lineTo(px + 5, py - 10);
      g.closePath();
      g.fill();
      // The label, moved up while it would cover an earlier one.
      const text = "peak " + bytes(s.peak) + " (" + seriesName(s) + ")";
      const tw = g.measureText(text).width;
      const left = px > M.left + plotW - tw - 10;
      const x0 = left ? px - 7 - tw : px + 7;
      let ly = py - 8;
      while (labels.some((l) => x0 < l.x + l.w && l.x < x0 + tw && ly > l.y - 13 && l.y > ly - 13)) ly -= 13;
      labels.push({ x: x0, y: ly, w: tw });
      g.textAlign = "left";
      g.textBaseline = "bottom";
      g.fillText(text, x0, ly);
    });

    // Events: allocations above the strip's middle line, frees below, stacked by API.
    const mid = M.top + M.chart + M.gap + M.strip / 2;
    let most = 1;
    for (const bucket of lane.buckets)
      for (const r of bucket) most = Math.max(most, r[1], r[2]);
    const h = (n) => (n > 0 ? 2 + (Math.log1p(n) / Math.log1p(most)) * (M.strip / 2 - 3) : 0);
    const w = Math.max(1, plotW / B);
    lane.buckets.forEach((bucket, b) => {
      let up = 0;
      let down = 0;
      const x = bx(b) - w / 2;
      const allocs = bucket.reduce((a, r) => a + r[1], 0);
      const frees = bucket.reduce((a, r) => a + r[2], 0);
      const hu = h(allocs);
      const hd = h(frees);
      for (const r of bucket) {
        g.fillStyle = apiColor(r[0]);
        if (r[1] > 0) {
          const part = (hu * r[1]) / allocs;
          g.fillRect(x, mid - up - part, w, part);
          up += part;
        }
        if (r[2] > 0) {
          const part = (hd * r[2]) / frees;
          g.fillRect(x, mid + down, w, part);
          down += part;
        }
      }
    });
    g.strokeStyle = "#c9ccd6";
    g.beginPath();
    g.moveTo(M.left, mid);
    g.lineTo(M.left + plotW, mid);
    g.stroke();
    g.fillStyle = "#555";
    g.textAlign = "right";
    g.textBaseline = "middle";
    g.fillText("allocs", M.left - 6, mid - M.strip / 4);
    g.fillText("frees", M.left - 6, mid + M.strip / 4);
    return { plotW };
  }

  function details(data, lane, b) {
    const lo = ((data.span + 1) * b) / data.buckets;
    const hi = ((data.span + 1) * (b + 1)) / data.buckets;
    const lines = [lane.name + "  " + when(data, lo) + " – " + when(data, hi)];
    for (const s of lane.series) {
      if (s.peak === 0) continue;
      const range = s.min[b] === s.max[b] ? "" : "  (" + bytes(s.min[b]) + " – " + bytes(s.max[b]) + ")";
      lines.push(seriesName(s) + ": " + bytes(s.last[b]) + " live" + range);
    }
    const bucket = lane.buckets[b];
    if (bucket.length === 0) lines.push("no events");
    for (const r of bucket) {
      const parts = [];
      if (r[1] > 0) parts.push(r[1] + " alloc " + bytes(r[3]));
      if (r[2] > 0) parts.push(r[2] + " free " + bytes(r[4]));
      lines.push("  " + data.apis[r[0]] + ": " + parts.join(", "));
    }
    const e = lane.largest[b];
    if (e) {
      lines.push("largest: " + (e[0] ? "alloc " : "free ") + data.apis[e[1]] + " " + bytes(e[2]) +
        " at " + e[3] + " (" + seriesName(lane.series[e[4]]) + ", " + when(data, e[5]) + ")");
    }
    return lines.join("\n");
  }

  // Draws one view (time or event order) of every lane into #lanes.
  // Options in the URL's fragment, e.g. `#order&bucket=120`: the event-order axis, and the
  // details of bucket 120 pinned under every lane (a link to one moment).
  function fragment() {
    const opts = {};
    for (const part of location.hash.replace(/^#/, "").split("&")) {
      const [key, value] = part.split("=");
      if (key) opts[key] = value === undefined ? true : value;
    }
    return opts;
  }

  function renderView(data, tip) {
    const lanesEl = document.getElementById("lanes");
    lanesEl.textContent = "";
    const total = data.lanes.reduce((a, l) => a + l.events, 0);
    document.getElementById("meta").textContent = data.lanes.length + " trace" +
      (data.lanes.length === 1 ? "" : "s") + ", " + total.toLocaleString("en") + " events" +
      (data.timed ? " over " + when(data, data.span) + " (lanes aligned in time)" : ", x is each event's position in its trace");
    const redraws = [];
    for (const lane of data.lanes) {
      const box = document.createElement("section");
      box.className = "lane";
      const title = document.createElement("h2");
      title.textContent = lane.name + " — " + lane.events.toLocaleString("en") + " events" +
        (lane.skipped ? ", " + lane.skipped + " unreadable lines skipped" : "");
      box.appendChild(title);
      const series = document.createElement("div");
      series.className = "legend";
      legend(series, lane.series.map((s, i) => [seriesName(s) + " (peak " + bytes(s.peak) + ")", seriesColor(s, i)])
        .filter((_, i) => lane.series[i].peak > 0));
      box.appendChild(series);
      const canvas = document.createElement("canvas");
      box.appendChild(canvas);
      const cursor = document.createElement("div");
      cursor.className = "cursor";
      cursor.hidden = true;
      box.appendChild(cursor);
      const sum = document.createElement("details");
      sum.open = data.lanes.length <= 2;
      const label = document.createElement("summary");
      label.textContent = "Summary (as in the exit report)";
      const pre = document.createElement("pre");
      pre.textContent = lane.summary.replace(/^\n/, "");
      sum.append(label, pre);
      box.appendChild(sum);
      const pinned = Number.parseInt(fragment().bucket, 10);
      if (pinned >= 0 && pinned < data.buckets) {
        const pre = document.createElement("pre");
        pre.className = "pinned";
        pre.textContent = details(data, lane, pinned);
        box.insertBefore(pre, sum);
      }
      lanesEl.appendChild(box);
      let geometry = drawLane(data, lane, canvas);
      redraws.push(() => { geometry = drawLane(data, lane, canvas); });
      canvas.addEventListener("mousemove", (ev) => {
        const rect = canvas.getBoundingClientRect();
        const x = ev.clientX - rect.left - M.left;
        if (x < 0 || x > geometry.plotW) { tip.hidden = true; cursor.hidden = true; return; }
        const b = Math.min(data.buckets - 1, Math.floor((x / geometry.plotW) * data.buckets));
        tip.textContent = details(data, lane, b);
        tip.hidden = false;
        tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8) + "px";
        tip.style.top = ev.clientY + 14 + "px";
        cursor.hidden = false;
        cursor.style.left = canvas.offsetLeft + M.left + x + "px";
      });
      canvas.addEventListener("mouseleave", () => { tip.hidden = true; cursor.hidden = true; });
    }
    return redraws;
  }

  function main() {
    const model = JSON.parse(document.getElementById("cuhook-data").textContent);
    const views = model.views.map((v) => Object.assign({ buckets: model.buckets, apis: model.apis }, v));
    legend(document.getElementById("apis"), model.apis.map((a, i) => [a, apiColor(i)]));
    const tip = document.getElementById("tip");
    const axis = document.getElementById("axis");
    let redraws = [];
    function show(view) {
      redraws = renderView(view, tip);
      for (const b of axis.querySelectorAll("button"))
        b.setAttribute("aria-pressed", String((b.dataset.axis === "time") === view.timed));
    }
    for (const b of axis.querySelectorAll("button")) {
      const view = views.find((v) => (b.dataset.axis === "time") === v.timed);
      if (view) b.addEventListener("click", () => { location.hash = b.dataset.axis; show(view); });
      else b.disabled = true;
    }
    window.addEventListener("resize", () => redraws.forEach((r) => r()));
    const wanted = fragment().order ? views.find((v) => !v.timed) : views[0];
    show(wanted || views[0]);
    const lanes = views[0].lanes.length;
    statusEl.textContent = "rendered " + lanes + " lane" + (lanes === 1 ? "" : "s") +
      " (" + model.buckets + " buckets each; numbers in the summaries are exact)";
  }

  try {
    main();
    if (document.body.dataset.status !== "error") {
      document.body.dataset.status = "ok";
      statusEl.dataset.status = "ok";
    }
  } catch (e) {
    fail(e && e.stack ? e.stack : String(e));
  }
})();
