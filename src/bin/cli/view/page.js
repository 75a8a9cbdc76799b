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

  // Two palettes that share no colour: memory types are drawn in dark, saturated blues,
  // purples and browns (the chart), APIs in light mid tones (the event strip), so a colour
  // never means both.
  const API_COLORS = ["#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#e5c020",
    "#e5c494", "#9a9a9a", "#5fb8b0", "#f4a3a8", "#b5a2d6", "#c2b280", "#9ccf8a", "#f0a85e"];
  const SERIES_COLORS = { cuda: ["#1f4fa8", "#0b6f75", "#3a2fb0", "#2a7fd8"],
    managed: ["#7b2d9a", "#a23fa6"], host: ["#d35400", "#a93226"], unknown: ["#4d5656"] };

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
  function duration(ns) {
    if (ns < 1e3) return ns + " ns";
    if (ns < 1e6) return (ns / 1e3).toFixed(1) + " µs";
    if (ns < 1e9) return (ns / 1e6).toFixed(2) + " ms";
    return (ns / 1e9).toFixed(3) + " s";
  }
  // A round step (1, 2 or 5 times a power of ten) that cuts `range` into about `count` parts.
  function niceStep(range, count) {
    const raw = Math.max(range, 1e-9) / count;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }
  // Tick values from lo to hi at a round step: [value, ...].
  function ticks(lo, hi, count, step) {
    step = step || niceStep(hi - lo, count);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return { step, values: out };
  }
  // Byte ticks: round numbers of the unit that fits the largest value (0, 20 MiB, 40 MiB ...).
  function byteTicks(max, count) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let u = 0;
    while (max >= 1024 * 1.5 && u + 1 < units.length) { max /= 1024; u++; }
    const t = ticks(0, max, count);
    const scale = Math.pow(1024, u);
    return t.values.map((v) => [v * scale, v === 0 ? "0" : (t.step < 1 ? v.toFixed(1) : String(Math.round(v))) + " " + units[u]]);
  }
  // Time ticks over [lo, hi] ns: round numbers of one unit (ns, µs, ms, s).
  function timeTicks(lo, hi, count) {
    const range = hi - lo;
    const [div, unit] = range >= 5e9 ? [1e9, "s"] : range >= 5e6 ? [1e6, "ms"] : range >= 5e3 ? [1e3, "µs"] : [1, "ns"];
    const t = ticks(lo / div, hi / div, count);
    const digits = Math.max(0, -Math.floor(Math.log10(t.step) + 1e-9));
    return t.values.map((v) => [v * div, v === 0 ? "0" : v.toFixed(digits) + " " + unit]);
  }
  function eventTicks(lo, hi, count) {
    const t = ticks(lo, hi, count, Math.max(1, niceStep(hi - lo, count)));
    return t.values.map((v) => [v, Math.round(v).toLocaleString("en")]);
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

  const M = { left: 84, right: 12, top: 16, chart: 200, gap: 10, strip: 44, axis: 36 };

  // The x range shown, in bucket units: [lo, hi) of [0, buckets). Shared by every lane, so
  // lanes stay aligned; changed by the wheel (zoom), a drag (pan) and a double-click (reset),
  // and kept in the URL (`zoom=LO-HI`) so that a zoomed view can be linked to.
  const zoom = { lo: 0, hi: 0 };

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
    const per = plotW / (zoom.hi - zoom.lo);
    const bx = (b) => M.left + (b + 0.5 - zoom.lo) * per;
    const first = Math.max(0, Math.floor(zoom.lo));
    const last = Math.min(B - 1, Math.ceil(zoom.hi) - 1);
    // The y scale fits what is shown: the peak of the visible buckets.
    let top = 1;
    for (const s of lane.series)
      for (let b = first; b <= last; b++) top = Math.max(top, s.max[b]);
    const yt = byteTicks(top, 4);
    const yMax = Math.max(top * 1.12, yt[yt.length - 1][0]);
    const y = (v) => M.top + M.chart - (v / yMax) * M.chart;

    // Axes, round ticks and their titles.
    g.strokeStyle = "#e3e5ec";
    g.fillStyle = "#555";
    g.textAlign = "right";
    g.textBaseline = "middle";
    for (const [v, label] of yt) {
      g.beginPath();
      g.moveTo(M.left, y(v));
      g.lineTo(M.left + plotW, y(v));
      g.stroke();
      g.fillText(label, M.left - 6, y(v));
    }
    canvas.dataset.yticks = yt.map((t) => t[1]).join(", ");
    const xAt = (u) => ((data.span + 1) * u) / B; // bucket units → x (ns or event number)
    const uAt = (x) => (x * B) / (data.span + 1);
    const x0 = xAt(zoom.lo);
    const x1 = xAt(zoom.hi);
    const xt = data.timed ? timeTicks(x0, x1, 6) : eventTicks(x0, x1, 6);
    const axisY = M.top + M.chart + M.gap + M.strip + 4;
    g.textBaseline = "top";
    g.textAlign = "center";
    for (const [v, label] of xt) {
      const px = M.left + (uAt(v) - zoom.lo) * per;
      g.strokeStyle = "#c9ccd6";
      g.beginPath();
      g.moveTo(px, axisY - 4);
      g.lineTo(px, axisY - 1);
      g.stroke();
      g.fillText(label, Math.min(Math.max(px, M.left + 10), M.left + plotW - 10), axisY);
    }
    canvas.dataset.xticks = xt.map((t) => t[1]).join(", ");
    g.fillStyle = "#333";
    g.fillText(data.timed ? "time since the first event of all traces" : "event number in this trace",
      M.left + plotW / 2, axisY + 15);
    g.save();
    g.translate(12, M.top + M.chart / 2);
    g.rotate(-Math.PI / 2);
    g.textBaseline = "middle";
    g.fillText("live bytes", 0, 0);
    g.restore();

    // Everything in the plot is clipped to it.
    g.save();
    g.beginPath();
    g.rect(M.left, 0, plotW, height);
    g.clip();

    // Live bytes: the band between each bucket's min and max, and a line through its last value.
    const labels = [];
    lane.series.forEach((s, i) => {
      if (s.peak === 0) return; // only frees of unknown pointers: nothing was ever live
      const color = seriesColor(s, i);
      g.fillStyle = color + "40";
      g.beginPath();
      for (let b = first; b <= last; b++) g.lineTo(bx(b), y(s.max[b]));
      for (let b = last; b >= first; b--) g.lineTo(bx(b), y(s.min[b]));
      g.closePath();
      g.fill();
      g.strokeStyle = color;
      g.lineWidth = 1.5;
      g.beginPath();
      for (let b = first; b <= last; b++) g.lineTo(bx(b), y(s.last[b]));
      g.stroke();
      // The exact peak, at the bucket it was first reached in (when that is shown).
      const pb = Math.min(Math.floor(uAt(s.peak_x)), B - 1);
      if (pb < first || pb > last) return;
      const px = bx(pb);
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
      const lx = left ? px - 7 - tw : px + 7;
      let ly = py - 8;
      while (labels.some((l) => lx < l.x + l.w && l.x < lx + tw && ly > l.y - 13 && l.y > ly - 13)) ly -= 13;
      labels.push({ x: lx, y: ly, w: tw });
      g.textAlign = "left";
      g.textBaseline = "bottom";
      g.fillText(text, lx, ly);
    });

    // Events: allocations above the strip's middle line, frees below, stacked by API.
    const mid = M.top + M.chart + M.gap + M.strip / 2;
    let most = 1;
    for (const bucket of lane.buckets)
      for (const r of bucket) most = Math.max(most, r[1], r[2]);
    const h = (n) => (n > 0 ? 2 + (Math.log1p(n) / Math.log1p(most)) * (M.strip / 2 - 3) : 0);
    // At least 2 px an event bar: a lone event stays visible at any zoom.
    const w = Math.max(2, per);
    for (let b = first; b <= last; b++) {
      const bucket = lane.buckets[b];
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
    }
    g.restore();
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
      lines.push("  " + lifetime(data, e));
    }
    return lines.join("\n");
  }

  // The life of the largest event's allocation: when it began and ended, and how long it was.
  function lifetime(data, e) {
    const other = e[6];
    const span = (a, z) => (data.timed ? duration(z - a) : (z - a).toLocaleString("en") + " events");
    if (e[0]) {
      return other === null ? "still live at the end of the trace (lived " + span(e[5], data.span) + "+)"
        : "freed at " + when(data, other) + ", lived " + span(e[5], other);
    }
    return other === null ? "allocated before the trace began (or never seen allocated)"
      : "allocated at " + when(data, other) + ", lived " + span(other, e[5]);
  }

  // Options in the URL's fragment, e.g. `#order&zoom=100-220&bucket=120`: the event-order axis,
  // buckets 100 to 220 shown, and the details of bucket 120 pinned under every lane.
  function fragment() {
    const opts = {};
    for (const part of location.hash.replace(/^#/, "").split("&")) {
      const [key, value] = part.split("=");
      if (key) opts[key] = value === undefined ? true : value;
    }
    return opts;
  }
  function setFragment(key, value) {
    const opts = fragment();
    if (value === null) delete opts[key];
    else opts[key] = value;
    const text = Object.entries(opts).map(([k, v]) => (v === true ? k : k + "=" + v)).join("&");
    history.replaceState(null, "", text ? "#" + text : location.pathname + location.search);
  }

  function describeZoom(data) {
    const el = document.getElementById("zoom");
    const B = data.buckets;
    if (zoom.lo <= 0 && zoom.hi >= B) {
      el.textContent = "the whole run (wheel over a chart zooms, drag pans, double-click resets)";
    } else {
      const at = (u) => when(data, ((data.span + 1) * u) / B);
      el.textContent = "zoomed to " + at(zoom.lo) + " – " + at(zoom.hi) + " (" +
        (B / (zoom.hi - zoom.lo)).toFixed(1) + "×; double-click resets)";
    }
    el.dataset.lo = String(Math.round(zoom.lo));
    el.dataset.hi = String(Math.round(zoom.hi));
  }

  function renderView(data, tip) {
    const lanesEl = document.getElementById("lanes");
    lanesEl.textContent = "";
    const total = data.lanes.reduce((a, l) => a + l.events, 0);
    document.getElementById("meta").textContent = data.lanes.length + " trace" +
      (data.lanes.length === 1 ? "" : "s") + ", " + total.toLocaleString("en") + " events" +
      (data.timed ? " over " + when(data, data.span) + " (lanes aligned in time)" : ", x is each event's position in its trace");
    const B = data.buckets;
    const canvases = [];
    const redraw = () => {
      for (const c of canvases) c.geometry = drawLane(data, c.lane, c.canvas);
      describeZoom(data);
    };
    const setZoom = (lo, hi) => {
      const width = Math.min(B, Math.max(4, hi - lo));
      lo = Math.min(Math.max(0, lo), B - width);
      zoom.lo = lo;
      zoom.hi = lo + width;
      const whole = zoom.lo <= 0 && zoom.hi >= B;
      setFragment("zoom", whole ? null : Math.round(zoom.lo) + "-" + Math.round(zoom.hi));
      redraw();
    };
    for (const lane of data.lanes) {
      const box = document.createElement("section");
      box.className = "lane";
      const title = document.createElement("h2");
      title.textContent = lane.name + " — " + lane.events.toLocaleString("en") + " events" +
        (lane.skipped ? ", " + lane.skipped + " unreadable lines skipped" : "");
      box.appendChild(title);
      const series = document.createElement("div");
      series.className = "legend";
      const caption = document.createElement("b");
      caption.textContent = "live bytes by memory type:";
      series.appendChild(caption);
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
      if (lane.sites && lane.sites.length) {
        // Call sites (`cuhook run --stacks`): hover a row for its whole stack.
        const sites = document.createElement("details");
        sites.open = data.lanes.length <= 2;
        const caption = document.createElement("summary");
        caption.textContent = "Top call sites: live at the end, and at the peak";
        const table = document.createElement("table");
        table.className = "sites";
        const head = table.insertRow();
        for (const h of ["live at end", "allocations", "at the peak", "call site (hover: stack)"]) {
          const th = document.createElement("th");
          th.textContent = h;
          head.appendChild(th);
        }
        for (const s of lane.sites) {
          const row = table.insertRow();
          row.title = s.frames.join("\n");
          for (const text of [bytes(s.end), String(s.count), bytes(s.peak), s.frames[0] || "?"]) {
            row.insertCell().textContent = text;
          }
        }
        sites.append(caption, table);
        box.appendChild(sites);
      }
      const pinned = Number.parseInt(fragment().bucket, 10);
      if (pinned >= 0 && pinned < B) {
        const pre = document.createElement("pre");
        pre.className = "pinned";
        pre.textContent = details(data, lane, pinned);
        box.insertBefore(pre, sum);
      }
      lanesEl.appendChild(box);
      const entry = { lane, canvas, geometry: null };
      canvases.push(entry);
      // The bucket under a mouse position, and the position in bucket units.
      const at = (ev) => {
        const rect = canvas.getBoundingClientRect();
        const x = ev.clientX - rect.left - M.left;
        const u = zoom.lo + (x / entry.geometry.plotW) * (zoom.hi - zoom.lo);
        return { x, u, b: Math.min(B - 1, Math.max(0, Math.floor(u))) };
      };
      let drag = null;
      canvas.addEventListener("mousemove", (ev) => {
        const p = at(ev);
        if (drag) {
          const shift = ((ev.clientX - drag.x) / entry.geometry.plotW) * (drag.hi - drag.lo);
          setZoom(drag.lo - shift, drag.hi - shift);
          return;
        }
        if (p.x < 0 || p.x > entry.geometry.plotW) { tip.hidden = true; cursor.hidden = true; return; }
        tip.textContent = details(data, lane, p.b);
        tip.hidden = false;
        tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8) + "px";
        tip.style.top = ev.clientY + 14 + "px";
        cursor.hidden = false;
        cursor.style.left = canvas.offsetLeft + M.left + p.x + "px";
      });
      canvas.addEventListener("mouseleave", () => { tip.hidden = true; cursor.hidden = true; drag = null; });
      canvas.addEventListener("mousedown", (ev) => {
        drag = { x: ev.clientX, lo: zoom.lo, hi: zoom.hi };
        tip.hidden = true;
        ev.preventDefault();
      });
      window.addEventListener("mouseup", () => { drag = null; });
      canvas.addEventListener("wheel", (ev) => {
        ev.preventDefault();
        const p = at(ev);
        const factor = Math.pow(1.2, Math.sign(ev.deltaY));
        const u = Math.min(Math.max(p.u, zoom.lo), zoom.hi);
        setZoom(u - (u - zoom.lo) * factor, u + (zoom.hi - u) * factor);
      }, { passive: false });
      canvas.addEventListener("dblclick", () => setZoom(0, B));
    }
    redraw();
    return redraw;
  }

  function main() {
    const model = JSON.parse(document.getElementById("cuhook-data").textContent);
    const views = model.views.map((v) => Object.assign({ buckets: model.buckets, apis: model.apis }, v));
    const apis = document.getElementById("apis");
    const caption = document.createElement("b");
    caption.textContent = "events by API (strip under each chart):";
    apis.appendChild(caption);
    legend(apis, model.apis.map((a, i) => [a, apiColor(i)]));
    const tip = document.getElementById("tip");
    const axis = document.getElementById("axis");
    let redraw = () => {};
    zoom.lo = 0;
    zoom.hi = model.buckets;
    const wanted = (fragment().zoom || "").split("-").map((v) => Number.parseFloat(v));
    if (wanted.length === 2 && wanted[0] >= 0 && wanted[1] <= model.buckets && wanted[1] - wanted[0] >= 4) {
      zoom.lo = wanted[0];
      zoom.hi = wanted[1];
    }
    function show(view) {
      redraw = renderView(view, tip);
      for (const b of axis.querySelectorAll("button"))
        b.setAttribute("aria-pressed", String((b.dataset.axis === "time") === view.timed));
    }
    for (const b of axis.querySelectorAll("button")) {
      const view = views.find((v) => (b.dataset.axis === "time") === v.timed);
      if (view) {
        b.addEventListener("click", () => {
          setFragment("order", b.dataset.axis === "order" ? true : null);
          zoom.lo = 0;
          zoom.hi = model.buckets;
          setFragment("zoom", null);
          show(view);
        });
      } else b.disabled = true;
    }
    window.addEventListener("resize", () => redraw());
    const first = fragment().order ? views.find((v) => !v.timed) : views[0];
    show(first || views[0]);
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
