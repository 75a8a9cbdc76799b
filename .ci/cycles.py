#!/usr/bin/env python3
"""Fails when source files of the crate import each other in a cycle.

Edges come from `crate::…` and `super::…` paths (in `use` lines and inline), resolved to the
file that defines the module. A module and its own submodules may refer to each other (a
folder's rooms share its private types); any other cycle is reported. Usage: .ci/cycles.py [src]"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
files = {}  # module path tuple -> file
for dirpath, _, names in os.walk(root):
    for n in names:
        if not n.endswith(".rs"):
            continue
        rel = os.path.relpath(os.path.join(dirpath, n), root)
        parts = rel[:-3].split(os.sep)
        if parts[-1] in ("mod", "lib"):
            parts = parts[:-1]
        if parts and parts[0] == "bin":
            continue
        files[tuple(parts)] = rel


def resolve(path):
    """The longest module prefix of `path` that is a file of ours."""
    for k in range(len(path), -1, -1):
        if tuple(path[:k]) in files:
            return tuple(path[:k])
    return None


PATH = re.compile(r"\b(crate|super)((?:::(?:super|\w+))*)(?:::\{([^}]*)\})?")
edges = {m: set() for m in files}
for mod, rel in files.items():
    text = open(os.path.join(root, rel), encoding="utf-8").read()
    text = re.sub(r"//[^\n]*", "", text)  # comments and doc links do not import
    here = list(mod)
    for m in PATH.finditer(text):
        head, rest, group = m.group(1), m.group(2), m.group(3)
        segs = [s for s in rest.split("::") if s]
        if head == "crate":
            base = []
        else:  # `super` in module M (its mod.rs or M.rs) is M's parent
            base = here[:-1]
            while segs and segs[0] == "super":
                base = base[:-1]
                segs = segs[1:]
        targets = [segs]
        if group is not None:
            targets = [segs + [g.strip().split("::")[0]] for g in group.split(",") if g.strip()]
        for t in targets:
            target = resolve(base + [s for s in t if s not in ("self", "*")])
            if target is not None and target != mod:
                edges[mod].add(target)


def related(a, b):
    return a[: len(b)] == b or b[: len(a)] == a


# Tarjan's strongly connected components, ignoring edges between a module and its ancestors.
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges[v]:
        if related(v, w):
            continue
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(comp)


for v in sorted(edges):
    if v not in index:
        visit(v)
for comp in sccs:
    print("cycle among: " + ", ".join(sorted(files[m] for m in comp)))
print(f"{len(files)} files, {sum(len(e) for e in edges.values())} import edges, {len(sccs)} cycles")
sys.exit(1 if sccs else 0)
