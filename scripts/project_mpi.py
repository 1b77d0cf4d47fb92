#!/usr/bin/env python3
"""project_mpi.py: decode tok/s of the real model on N = 1..8 machines, from the MPI traffic
`dsflash bench` measured and the plan `dsflash inspect --parallel` gives (docs/PERFORMANCE.md,
"Several processes (MPI)").

usage: scripts/project_mpi.py [--bin build/dsflash] [--model REAL.gguf]
           [--pipeline BYTES,MSGS[,RANKS]] [--experts BYTES,MSGS[,RANKS]] [--bench-layers 8]
           [--bw GB/s] [--fraction F] [--topk 6] [--max-n 8]

Inputs, each printed with its label:
  MEASURED  the bytes and messages all ranks sent per decoded token, for --parallel pipeline
            and for --parallel experts (the last line of `mpirun -np RANKS dsflash bench -m
            BENCH.gguf --parallel MODE`: decode_mpi_bytes_per_token, decode_mpi_msgs_per_token).
            Until given, the figures the message layout implies for the bench model at 2 ranks
            are used, and labelled so (LAYOUT): pipeline 599124 B in 4 messages (rank 0's op
            of 44 B in 2, the stream of 81960 B, the logits of 517120 B back); experts 327724 B
            in 18 (the op, and per layer one partial sum of 20480 B each way).
  PLAN      per rank: its layers, experts and weight bytes (`dsflash inspect --parallel MODE
            --ranks N` on the real model's header, made with `dsflash synth --preset real
            --header-only` when --model is not given), the routed experts' total and the layer
            count (`dsflash inspect --plan`).
  ASSUMED   each machine's memory read bandwidth and the share of it decode reaches (default:
            one Zen 4 socket of 12 x DDR5-4800, ~400 GB/s STREAM-like, at 0.85: the fraction
            measured on 2 cores here, docs/PERFORMANCE.md "The real model"); each fabric's link
            bandwidth and per-message latency (100 Gb/s Ethernet over TCP: 12.5 GB/s, 25 us;
            400 Gb/s RDMA over UCX: 50 GB/s, 3 us).

The model, deliberately simple (one token of one sequence at a short context; attention's KV
reads, the sampler and the kernels' compute are left out; every message is taken to be on
the critical path, which overstates the pipeline's op messages, which overlap):
  a rank's time for a token = (its dense bytes + the routed bytes it reads) / (bw x fraction);
  the routed bytes it reads: pipeline, all experts on the rank: top-k experts of each of its
  layers; experts split over M members: a layer waits for the member that drew the most of the
  token's top-k experts (the expected maximum, drawn here by simulation over contiguous id
  ranges, as the plan splits them);
  traffic: pipeline, each cut adds what the measured cuts carried (bytes and messages per
  token over RANKS - 1 cuts); experts, each member beyond the first adds per layer what the
  measured run's extra member sent per layer; time = messages x latency + bytes / link;
  pipeline, one sequence: the sum over stages + the traffic;
  pipeline, N sequences at once (micro-batches): throughput approaches 1 / the slowest stage
  (its read + one cut's traffic); the column gives the total of all sequences;
  experts: the one stage's time + the traffic;
  pipeline,experts (2 stages of N/2 members): the sum over the 2 stages + both traffics; with 2
  sequences at once, 1 / the slower stage.
"""
import argparse
import os
import random
import re
import subprocess
import sys
import tempfile

LAYOUT = {"pipeline": (599124.0, 4.0, 2), "experts": (327724.0, 18.0, 2)}
FABRICS = [("100 Gb/s Ethernet (TCP)", 12.5, 25e-6), ("400 Gb/s RDMA (UCX)", 50.0, 3e-6)]


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("project_mpi: %s failed: %s" % (" ".join(cmd), r.stderr.strip() or r.stdout.strip()))
    return r.stdout


def model_totals(binary, model):
    """(routed experts bytes, layers) from inspect --plan."""
    out = run([binary, "inspect", "--plan", model, "--ram", "100000"])
    m = re.search(r"(\d+) layers", out)
    r = re.search(r"routed experts\s+([\d.]+) GiB", out)
    if not m or not r:
        sys.exit("project_mpi: inspect --plan printed no layer count or routed experts:\n" + out)
    return float(r.group(1)) * 2**30, int(m.group(1))


RANK = re.compile(r"rank (\d+): stage (\d+), layers (\d+)-(\d+), experts (\d+)-(\d+): ([\d.]+) GB of weights")


def plan(binary, model, mode, n, stages=0):
    """[(stage, l0, l1, e0, e1, weight bytes)] per rank from inspect --parallel."""
    cmd = [binary, "inspect", "--parallel", mode, "--ranks", str(n)]
    if stages:
        cmd += ["--stages", str(stages)]
    out = run(cmd + [model])
    ranks = []
    for m in RANK.finditer(out):
        ranks.append((int(m.group(2)), int(m.group(3)), int(m.group(4)) + 1, int(m.group(5)), int(m.group(6)) + 1,
                      float(m.group(7)) * 1e9))
    if len(ranks) != n:
        sys.exit("project_mpi: inspect --parallel %s --ranks %d printed %d rank lines:\n%s" % (mode, n, len(ranks), out))
    return ranks


def max_load(members, n_exp, k, draws=20000):
    """Expected largest number of a token's k distinct experts (of n_exp) that land in one of
    `members` contiguous id ranges (the plan's split)."""
    if members <= 1:
        return float(k)
    rng = random.Random(1)
    bounds = [n_exp * m // members for m in range(members + 1)]
    owner = [0] * n_exp
    for m in range(members):
        for e in range(bounds[m], bounds[m + 1]):
            owner[e] = m
    total = 0
    for _ in range(draws):
        cnt = [0] * members
        for e in rng.sample(range(n_exp), k):
            cnt[owner[e]] += 1
        total += max(cnt)
    return total / draws


def stage_reads(ranks, routed, layers, n_exp, k):
    """Per stage: (dense bytes of its busiest member, routed bytes a token reads there, members,
    layers)."""
    per_layer_expert = routed / layers / n_exp  # one expert's bytes in one layer
    stages = {}
    for st, l0, l1, e0, e1, w in ranks:
        own_routed = per_layer_expert * (l1 - l0) * (e1 - e0)
        stages.setdefault(st, []).append((w - own_routed, l1 - l0))
    out = []
    for st in sorted(stages):
        members = stages[st]
        nl = members[0][1]
        out.append((max(d for d, _ in members), nl * max_load(len(members), n_exp, k) * per_layer_expert, len(members), nl))
    return out


def parse_measured(txt, name):
    parts = txt.split(",")
    if len(parts) not in (2, 3):
        sys.exit("project_mpi: --%s wants BYTES,MSGS[,RANKS], got %r" % (name, txt))
    b, m = float(parts[0]), float(parts[1])
    n = int(parts[2]) if len(parts) == 3 else 2
    if n < 2:
        sys.exit("project_mpi: --%s: the measured run needs at least 2 ranks" % name)
    return b, m, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/dsflash")
    ap.add_argument("--model", help="the real model's GGUF or its header (default: synth --preset real --header-only)")
    ap.add_argument("--pipeline", help="MEASURED decode bytes,messages per token[,ranks] of --parallel pipeline")
    ap.add_argument("--experts", help="MEASURED decode bytes,messages per token[,ranks] of --parallel experts")
    ap.add_argument("--bench-layers", type=int, default=8, help="layers of the model --experts was measured on (bench: 8)")
    ap.add_argument("--bw", type=float, default=400.0, help="ASSUMED read bandwidth per machine, GB/s")
    ap.add_argument("--fraction", type=float, default=0.85, help="ASSUMED share of it decode reaches")
    ap.add_argument("--topk", type=int, default=6, help="routed experts per token (the model card: 6)")
    ap.add_argument("--max-n", type=int, default=8)
    a = ap.parse_args()

    tmp = None
    model = a.model
    if not model:
        tmp = tempfile.TemporaryDirectory()
        model = os.path.join(tmp.name, "real-header.gguf")
        run([a.bin, "synth", "--preset", "real", "--header-only", model])
    routed, layers = model_totals(a.bin, model)
    n_exp = plan(a.bin, model, "experts", 1)[0][4]
    meas = {}
    for mode in ("pipeline", "experts"):
        given = getattr(a, mode)
        meas[mode] = (parse_measured(given, mode), "MEASURED") if given else (LAYOUT[mode], "LAYOUT (not measured yet)")
    bw = a.bw * a.fraction * 1e9

    print("ASSUMED   memory read bandwidth per machine %.0f GB/s, decode at %.2f of it: %.0f GB/s" %
          (a.bw, a.fraction, bw / 1e9))
    for name, link, lat in FABRICS:
        print("ASSUMED   %s: link %.1f GB/s, %.0f us per message" % (name, link, lat * 1e6))
    for mode in ("pipeline", "experts"):
        (b, m, n), label = meas[mode]
        print("%-9s decode traffic of --parallel %s at %d ranks: %.0f bytes in %.2f messages per token" %
              (label.split()[0], mode, n, b, m) + ("" if label == "MEASURED" else "  [" + label + "]"))
    print("PLAN      %s: %d layers, %d routed experts (top %d), routed %.1f GB; weight bytes per rank from "
          "inspect --parallel" % (model if a.model else "synth --preset real --header-only", layers, n_exp, a.topk,
                                  routed / 1e9))

    (pb, pm, pn), _ = meas["pipeline"]
    (eb, em, en), _ = meas["experts"]
    cut_b, cut_m = pb / (pn - 1), pm / (pn - 1)  # one cut's share
    mem_b, mem_m = eb / ((en - 1) * a.bench_layers), em / ((en - 1) * a.bench_layers)  # per extra member and layer

    rows = []
    for n in range(1, a.max_n + 1):
        plans = [plan(a.bin, model, "pipeline", n), plan(a.bin, model, "experts", n)]
        if n >= 2:
            plans.append(plan(a.bin, model, "pipeline,experts", n, 2))
        reads = [stage_reads(p, routed, layers, n_exp, a.topk) for p in plans]
        mem = [max(w for *_, w in p) / 1e9 for p in plans]
        per_fabric = []
        for _, link, lat in FABRICS:
            def comm(b, m):
                return m * lat + b / (link * 1e9)

            t_cut = comm(cut_b, cut_m)
            tok = []
            for rd in reads:
                # each stage's time: its read, its members' chain of partial sums
                t = [(d + r) / bw + comm(mem_b, mem_m) * (m - 1) * nl for d, r, m, nl in rd]
                one = 1.0 / (sum(t) + (len(t) - 1) * t_cut)
                many = 1.0 / (max(t) + (t_cut if len(t) > 1 else 0.0))  # as many sequences as stages
                tok.append((one, many))
            per_fabric.append(tok)
        rows.append((n, per_fabric, mem))

    print()
    print("decode tok/s of the real model, one machine per rank, as %s / %s; \"S seqs\": as many sequences" %
          tuple(f[0].split(" (")[0] for f in FABRICS))
    print("at once as stages, their total; GB: the largest rank's weights")
    hdr = ("N", "pipeline, 1 seq", "pipeline, N seqs", "experts", "pipeline,experts --stages 2, 1 seq", "2 seqs",
           "GB per rank: pipeline / experts / both")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for n, pf, mem in rows:
        def pair(mode, k):
            if mode >= len(pf[0]):
                return "-"
            return " / ".join("%.1f" % f[mode][k] for f in pf)

        print("| %d | %s | %s | %s | %s | %s | %s |" % (n, pair(0, 0), pair(0, 1), pair(1, 0), pair(2, 0), pair(2, 1),
                                                       " / ".join("%.0f" % m for m in mem)))
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
