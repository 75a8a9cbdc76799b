#!/usr/bin/env python3
"""Judge one workload run: every call must have produced exactly the expected event.

Usage: check.py LABEL OUTPUT_FILE [--runtime-api] — with --runtime-api, runtime calls must be
reported with the runtime's own name (shared runtime); otherwise any driver variant is accepted
(static runtime: only the driver is visible) and the one seen is reported."""
import re
import sys

label, path = sys.argv[1], sys.argv[2]
runtime_api = "--runtime-api" in sys.argv
fields = lambda line: dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
cells, problems, live, pending = {}, [], False, []
for line in open(path, errors="replace"):
    line = line.rstrip("\n")
    if line == "subscribed":
        live, pending = True, []
        continue
    if line.startswith("setup "):
        pending = []
        continue
    if line.startswith("check ") and " FAIL" in line:
        problems.append(line)
    if not live:
        continue
    if line.startswith("event "):
        f = fields(line)
        f["kind"] = line.split()[1]
        pending.append(f)
        continue
    if not line.startswith("call "):
        continue
    sym = line.split()[1]
    f = fields(line)
    events, pending = pending, []
    kind, addr, size = f["kind"], f["addr"], int(f["size"])
    verdict = None
    if kind == "none":
        if events:
            verdict = "unexpected events %s" % events
    elif kind in ("alloc", "free", "purge"):
        want = "alloc" if kind == "alloc" else "free"
        if f["rc"] != "0":
            verdict = "call failed rc=%s" % f["rc"]
        elif len(events) == 0:
            verdict = "missed"
        elif len(events) > 1:
            verdict = "duplicated %s" % events
        else:
            e = events[0]
            is_driver = sym.startswith("cu") and not sym.startswith("cuda")
            if is_driver:  # a per-thread-default-stream build calls the _ptsz twin
                api_ok = e["api"] in (sym, sym + "_ptsz")
            elif runtime_api:
                api_ok = e["api"] == sym
            else:  # static runtime: only its driver calls are visible
                api_ok = e["api"].startswith("cu") and not e["api"].startswith("cuda")
            if kind == "purge":
                api_ok = True
            if e["kind"] != want or e["addr"] != addr or int(e["size"]) != size or not api_ok:
                verdict = "wrong event %s (want %s %s size %d)" % (e, want, addr, size)
            elif kind == "purge" and not int(e["flags"], 16) & 0x40:
                verdict = "purge without PURGED flag"
            else:
                cells.setdefault(sym, set()).add(e["api"])
    else:
        verdict = "workload reported %s" % kind
    if verdict:
        problems.append("%s: %s" % (sym, verdict))
        cells.setdefault(sym, set()).add("MISSED")
for sym in sorted(cells):
    print("%-28s %-12s %s" % (sym, label, ",".join(sorted(cells[sym]))))
for p in problems:
    print("PROBLEM %s %s" % (label, p))
sys.exit(1 if problems or not cells else 0)
