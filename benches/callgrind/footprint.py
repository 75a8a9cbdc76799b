#!/usr/bin/env python3
"""Distinct cache lines one hooked pair touches, from a lackey trace (see footprint.c).

    footprint.py TRACE MAPS BEGIN END [LIB]

BEGIN and END are the marker variables' addresses (hex). With LIB (the preloaded library),
each line in it is named by the symbol it holds (its `.bss` is the anonymous mapping right
after its last file mapping) and the GOT entries read are counted apart.
"""
import re
import subprocess
import sys
from collections import Counter

LINE = 64


def mappings(path):
    maps = []
    for text in open(path):
        f = text.split()
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        name = f[5] if len(f) > 5 else ""
        maps.append([lo, hi, name, f[1]])
    return maps


def extent(lib):
    """End of the library's last segment in memory (its `.bss` included), from its program headers."""
    out = subprocess.run(["readelf", "-lW", lib], capture_output=True, text=True).stdout
    ends = [int(f[2], 16) + int(f[5], 16) for f in (t.split() for t in out.splitlines()) if f and f[0] == "LOAD"]
    return max(ends, default=0)


def got_targets(lib):
    """GOT slot offset -> what it points to (a relative address, or a symbol's name)."""
    out = subprocess.run(["readelf", "-rW", lib], capture_output=True, text=True).stdout
    slots = {}
    for f in (t.split() for t in out.splitlines()):
        if len(f) >= 4 and f[2] == "R_X86_64_RELATIVE":
            slots[int(f[0], 16)] = int(f[3], 16)
        elif len(f) >= 5 and f[2].startswith("R_X86_64_"):
            slots[int(f[0], 16)] = f[4].split("@")[0]
    return slots


def symbols(lib):
    out = subprocess.run(["nm", "-SC", "--defined-only", lib], capture_output=True, text=True).stdout
    syms = []
    for text in out.splitlines():
        f = text.split(None, 3)
        if len(f) == 4:
            syms.append((int(f[0], 16), int(f[1], 16), f[3]))
    return sorted(syms)


def main():
    trace, maps_path, begin, end = sys.argv[1], sys.argv[2], int(sys.argv[3], 16), int(sys.argv[4], 16)
    lib = sys.argv[5] if len(sys.argv) > 5 else None
    maps = mappings(maps_path)

    def where(addr):
        for lo, hi, name, perms in maps:
            if lo <= addr < hi:
                return name.split("/")[-1] or "[anon]", perms, name
        return "?", "", ""

    code, data, instructions, on = set(), {}, 0, False
    for text in open(trace):
        m = re.match(r"^\s*([ILSM])\s+([0-9a-f]+),(\d+)", text)
        if not m:
            continue
        kind, addr, size = m.group(1), int(m.group(2), 16), int(m.group(3))
        if kind in "SM" and addr == begin:
            on = True
            continue
        if kind in "SM" and addr == end:
            break
        if not on:
            continue
        lines = {addr // LINE, (addr + size - 1) // LINE}
        if kind == "I":
            instructions += 1
            code |= lines
        else:
            for line in lines:
                data.setdefault(line, set()).add(kind)
    print(f"instructions {instructions}, code lines {len(code)}, data lines {len(data)}")
    print("code lines by mapping: " + ", ".join(f"{k} {v}" for k, v in Counter(where(l * LINE)[0] for l in code).most_common()))
    print("data lines by mapping: " + ", ".join(f"{k} {v}" for k, v in Counter(" ".join(where(l * LINE)[:2]) for l in data).most_common()))
    if not lib:
        return
    base = min((lo for lo, _, name, _ in maps if name == lib), default=None)
    if base is None:
        return
    syms, got, size = symbols(lib), got_targets(lib), extent(lib)

    def named(off):
        hit = [n for a, s, n in syms if a <= off < a + max(s, 1)]
        return hit[0][:60] if hit else f"{off:#x}"

    funcs = Counter()
    for line in code:
        off = line * LINE - base
        if 0 <= off < size:
            hit = [n for a, s, n in syms if a <= off < a + max(s, 1)]
            funcs[hit[0][:90] if hit else f"{off:#x}"] += 1
    print(f"code lines in {lib.split('/')[-1]} by function: " + "; ".join(f"{n} {c}" for n, c in funcs.most_common()))
    print(f"data lines in {lib.split('/')[-1]} (offset in the object: what is there)")
    for line in sorted(data):
        off = line * LINE - base
        if not 0 <= off < size:
            continue
        names = [n for a, s, n in syms if a < off + LINE and a + max(s, 1) > off]
        slots = [got[o] for o in range(off, off + LINE, 8) if o in got]
        if slots and not names:
            what = "GOT entries for " + ", ".join(named(t) if isinstance(t, int) else t for t in slots[:4]) + (" ..." if len(slots) > 4 else "")
        else:
            what = "; ".join(n[:70] for n in names[:3]) or "(unnamed)"
        print(f"  {off:#8x} {''.join(sorted(data[line])):3} {what}")


main()
