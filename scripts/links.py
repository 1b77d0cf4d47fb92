#!/usr/bin/env python3
"""links.py: the link-level dependency graph of src/ (`make links`), read with nm from the
objects build/src/FOLDER/NAME.o.

An object depends on another when it uses (nm: U) a global symbol the other defines. Prints
the graph by folder (each edge with how many objects and symbols carry it), then fails (exit
1) on a link circle:
  - between folders (a folder that needs, through any chain, a folder that needs it back);
  - between mechanisms: a mechanism is FOLDER/STEM, where STEM is an object's name up to its
    first "_" (kernels/matmul_ref, matmul_avx2, matmul_avx512 and matmul_amx are one
    mechanism, kernels/matmul; server/server and server_api are server/server); objects of one
    mechanism may need each other, two mechanisms may not.
A circle is printed as the chain of objects and one symbol per step that closes it.
Usage: scripts/links.py [BUILD] (default: build).
"""
import glob
import os
import subprocess
import sys

DEFINED = set("TDBRCGSVWiu")  # nm -P types of a global definition (lower-case i/u: GNU ifunc/unique)


def symbols(obj):
    out = subprocess.run(["nm", "-P", "-g", obj], capture_output=True, text=True, check=True).stdout
    defs, uses = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        name, t = f[0], f[1]
        if t in ("U", "w", "v"):
            uses.add(name)
        elif t in DEFINED:
            defs.add(name)
    return defs, uses


def cycles(nodes, edges):
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, on, stack, comps, k = {}, {}, set(), [], [], [0]

    def strong(v):
        index[v] = low[v] = k[0]
        k[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
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
                comps.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return comps


def chain(comp, edges):
    """One closed path through the first node of comp that stays inside comp (breadth-first)."""
    start, inside = comp[0], set(comp)
    prev, todo = {start: None}, [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(edges.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w in inside and w not in prev:
                prev[w] = v
                todo.append(w)
    return comp


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    objs = sorted(glob.glob(os.path.join(build, "src", "*", "*.o")))
    if not objs:
        print(f"links: no objects under {build}/src (build them first: make)", file=sys.stderr)
        return 2
    name = {o: os.path.relpath(o, os.path.join(build, "src"))[:-2] for o in objs}  # folder/stem
    defs, uses, owner = {}, {}, {}
    for o in objs:
        defs[o], uses[o] = symbols(o)
        for s in defs[o]:
            owner.setdefault(s, o)
    # object edges with the symbols behind them
    oedge = {}
    for o in objs:
        for s in sorted(uses[o]):
            d = owner.get(s)
            if d and d != o:
                oedge.setdefault(name[o], {}).setdefault(name[d], []).append(s)
    folder = lambda n: n.split("/")[0]
    mech = lambda n: n.split("_")[0]
    fedge, mecedge = {}, {}
    for a, tos in oedge.items():
        for b, syms in tos.items():
            if folder(a) != folder(b):
                e = fedge.setdefault(folder(a), {}).setdefault(folder(b), [set(), 0])
                e[0].add(a)
                e[1] += len(syms)
            if mech(a) != mech(b):
                mecedge.setdefault(mech(a), set()).add(mech(b))
    print(f"links: {len(objs)} objects in {build}/src; each object -> the objects whose symbols it uses:")
    for f in sorted({folder(n) for n in name.values()}):
        print(f"  {f}/")
        for n in sorted(n for n in name.values() if folder(n) == f):
            tos = sorted(oedge.get(n, {}), key=lambda d: (folder(d) != f, d))
            print(f"    {n.split('/')[1] + '.o':18s} -> {' '.join(tos) or '-'}")
    print("links: folder -> the folders it needs (objects that need it, symbols used):")
    for f in sorted({folder(n) for n in name.values()}):
        tos = fedge.get(f, {})
        desc = ", ".join(f"{t} ({len(v[0])}, {v[1]})" for t, v in sorted(tos.items())) or "-"
        print(f"  {f:8s} -> {desc}")
    bad = 0
    fgraph = {a: set(t) for a, t in fedge.items()}
    for comp in cycles({folder(n) for n in name.values()}, fgraph):
        path = chain(comp, fgraph)
        steps = []
        for a, b in zip(path, path[1:]):
            carriers = sorted(o for o in fedge[a][b][0])
            o = carriers[0]
            d = next(d for d in sorted(oedge[o]) if folder(d) == b)
            steps.append(f"{a} -> {b} ({o}.o uses {oedge[o][d][0]} of {d}.o)")
        print("link circle between folders: " + "; ".join(steps))
        bad += 1
    ographs = {a: set(t) for a, t in oedge.items()}
    for comp in cycles(set(mecedge) | {m for t in mecedge.values() for m in t}, mecedge):
        # the objects behind the mechanisms' circle, and one path through them
        inside = {n for n in name.values() if mech(n) in comp}
        sub = {a: {b for b in ographs.get(a, ()) if b in inside} for a in inside}
        ocomps = [c for c in cycles(inside, sub) if len({mech(n) for n in c}) > 1]
        for oc in ocomps:
            path = chain(oc, sub)
            steps = [f"{a}.o -> {b}.o ({oedge[a][b][0]})" for a, b in zip(path, path[1:])]
            print(f"link circle between mechanisms {', '.join(sorted({mech(n) for n in oc}))}: " + "; ".join(steps))
            bad += 1
    if bad:
        print(f"links: {bad} circle(s)", file=sys.stderr)
        return 1
    print(f"links: ok: no circle between folders, none between mechanisms ({len(set(map(mech, name.values())))} "
          f"mechanisms, {sum(len(t) for t in oedge.values())} object edges)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
