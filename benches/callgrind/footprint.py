#!/usr/bin/env python3
"""Distinct cache lines one hooked pair touches, from a lackey trace (see footprint.c).

    footprint.py TRACE MAPS BEGIN END [LIB]

BEGIN and END are the marker variables' addresses (hex). With LIB (the preloaded library), the
addresses in it (its `.bss` included) count as its own, each code line is named by the function
whose instructions ran there, and each data line by what was accessed in it: a symbol, or the
GOT slots read (with what they point to).
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
        maps.append((lo, hi, f[5] if len(f) > 5 else "", f[1]))
    return maps


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True).stdout


def symbols(lib):
    syms = []
    for text in run("nm", "-SC", "--defined-only", lib).splitlines():
        f = text.split(None, 3)
        if len(f) == 4:
            syms.append((int(f[0], 16), int(f[1], 16), f[3]))
    return sorted(syms)


def extent(lib):
    """End of the library's last segment in memory (its `.bss` included)."""
    ends = [int(f[2], 16) + int(f[5], 16) for f in (t.split() for t in run("readelf", "-lW", lib).splitlines()) if f and f[0] == "LOAD"]
    return max(ends, default=0)


def relocations(lib):
    """Relocated slot offset -> what it will hold: a relative address, or a symbol's name."""
    slots = {}
    for f in (t.split() for t in run("readelf", "-rW", lib).splitlines()):
        if len(f) < 4 or not f[2].startswith("R_"):
            continue
        try:
            at = int(f[0], 16)
        except ValueError:
            continue
        if f[2].endswith("_RELATIVE"):
            slots[at] = int(f[3], 16)
        elif len(f) >= 5:
            slots[at] = f[4].split("@")[0]
        else:
            slots[at] = "TLS index" if "DTPMOD" in f[2] else f[2]
    return slots


def main():
    trace, maps_path, begin, end = sys.argv[1], sys.argv[2], int(sys.argv[3], 16), int(sys.argv[4], 16)
    lib = sys.argv[5] if len(sys.argv) > 5 else None
    maps = mappings(maps_path)
    base = min((lo for lo, _, name, _ in maps if lib and name == lib), default=None)
    size = extent(lib) if base is not None else 0

    def where(addr):
        if base is not None and 0 <= addr - base < size:
            return lib.split("/")[-1]
        for lo, hi, name, perms in maps:
            if lo <= addr < hi:
                return f"{name.split('/')[-1] or '[anon]'} {perms}"
        return "?"

    code, data, instructions, on = {}, {}, 0, False
    for text in open(trace):
        m = re.match(r"^\s*([ILSM])\s+([0-9a-f]+),(\d+)", text)
        if not m:
            continue
        kind, addr, n = m.group(1), int(m.group(2), 16), int(m.group(3))
        if kind in "SM" and addr == begin:
            on = True
            continue
        if kind in "SM" and addr == end:
            break
        if not on:
            continue
        if kind == "I":
            instructions += 1
        for line in {addr // LINE, (addr + n - 1) // LINE}:
            if kind == "I":
                code.setdefault(line, set()).add(addr)
            else:
                data.setdefault(line, {}).setdefault(kind, set()).add(max(addr, line * LINE))
    print(f"instructions {instructions}, code lines {len(code)}, data lines {len(data)}")
    for what, lines in (("code", code), ("data", data)):
        counts = Counter(where(line * LINE) for line in lines)
        print(f"{what} lines by mapping: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    if base is None:
        return
    syms, slots = symbols(lib), relocations(lib)

    def named(off):
        hit = [n for a, s, n in syms if a <= off < a + max(s, 1)]
        return hit[0][:70] if hit else f"{off:#x}"

    def slot(off):
        target = slots.get(off)
        if target is None:
            # The second word of a TLS index (its offset) has no relocation of its own.
            return "TLS index" if slots.get(off - 8) == "TLS index" else None
        return named(target) if isinstance(target, int) else target

    funcs = Counter()
    for line, addrs in code.items():
        if 0 <= line * LINE - base < size:
            funcs[named(min(addrs) - base)] += 1
    print(f"code lines in {lib.split('/')[-1]} by function: " + "; ".join(f"{n} {c}" for n, c in funcs.most_common()))
    print(f"data lines in {lib.split('/')[-1]} (offset in the object: what was accessed there)")
    for line in sorted(data):
        off = line * LINE - base
        if not 0 <= off < size:
            continue
        accessed = sorted({a - base for addrs in data[line].values() for a in addrs})
        got = [slot(a) for a in accessed if slot(a) is not None]
        what = ("GOT slots for " + ", ".join(got)) if got else "; ".join(dict.fromkeys(named(a) for a in accessed))
        print(f"  {off:#8x} {''.join(sorted(data[line])):3} {what}")


main()
