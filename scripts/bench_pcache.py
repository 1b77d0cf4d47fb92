#!/usr/bin/env python3
"""bench_pcache.py: the disk prefix cache's crossover, restoring N cached tokens from disk
against prefilling them, both timed in the same run of one `dsflash serve` process.

usage: scripts/bench_pcache.py MODEL.gguf [--bin build/dsflash] [--threads 2] [--sizes 16,64,256,1024]

For each N the server (one slot, --cache-dir in a fresh temp dir, --cache-every 0, and
DSF_PCACHE_RESTORE=always so that every restore is taken and timed) gets:
  1. a prompt of N + 1 random token ids (/v1/completions, max_tokens 1): a cold prefill of N + 1
     tokens; the server stores the state after the first N (one token before the prompt's end);
  2. an unrelated prompt, so that the slot no longer holds the first one in RAM;
  3. posix_fadvise(DONTNEED) on every entry file, so that the restore reads the disk, not the
     page cache (the files were fsync'ed: their pages are clean and can be dropped);
  4. the first prompt again: the server restores N tokens from disk, then prefills 1.
It prints per N: the entry's bytes, the restore time the server logs (read, checks,
dsf_session_restore), the cold request's time, and the prefill rate; the crossover is the
smallest N whose restore is faster than prefilling those N tokens.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=3600) as r:
        reply = json.loads(r.read())
    return time.monotonic() - t0, reply


def drop_cache(d):
    for name in os.listdir(d):
        if name.endswith(".dsfpc"):
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--bin", default="build/dsflash")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--sizes", default="16,64,256,1024")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    tmp = tempfile.mkdtemp(prefix="bench-pcache-")
    cache, log, port_file = os.path.join(tmp, "cache"), os.path.join(tmp, "serve.log"), os.path.join(tmp, "port")
    env = dict(os.environ, DSF_PCACHE_RESTORE="always", DSF_LOG="1")
    cmd = [a.bin, "serve", "-m", a.model, "--port", "0", "--port-file", port_file, "--threads", a.threads,
           "--ctx", str(max(sizes) + 64), "--prefill-chunk", "512", "--cache-dir", cache, "--cache-max-gb", "64",
           "--cache-every", "0"]
    srv = subprocess.Popen(cmd, env=env, stderr=open(log, "w"), stdout=subprocess.DEVNULL)
    try:
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if srv.poll() is not None:
                sys.exit(f"the server exited: see {log}")
            time.sleep(0.2)
        port = int(open(port_file).read())
        rng = random.Random(42)
        other = [rng.randrange(100, 1000) for _ in range(8)]
        post(port, {"prompt": other, "max_tokens": 1, "temperature": 0})  # warm-up
        print(f"{'N':>6} {'entry MB':>9} {'restore s':>10} {'prefill s':>10} {'prefill tok/s':>14} {'restored':>9}")
        for n in sizes:
            prompt = [rng.randrange(100, 1000) for _ in range(n + 1)]
            t_cold, r1 = post(port, {"prompt": prompt, "max_tokens": 1, "temperature": 0})
            post(port, {"prompt": other, "max_tokens": 1, "temperature": 0})
            time.sleep(0.5)  # the writer thread finishes the entry (fsync, rename)
            drop_cache(cache)
            seen = open(log).read().count("restored")
            t_warm, r2 = post(port, {"prompt": prompt, "max_tokens": 1, "temperature": 0})
            m = list(re.finditer(r"restored (\d+) tokens \((\d+) bytes\) from disk in ([0-9.]+) s", open(log).read()))
            cached = r2["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
            if len(m) <= seen or int(m[-1].group(1)) != n or cached != n:
                print(f"{n:>6}  no restore (cached {cached}); see {log}")
                continue
            nbytes, t_rest = int(m[-1].group(2)), float(m[-1].group(3))
            print(f"{n:>6} {nbytes / 1e6:>9.2f} {t_rest:>10.4f} {t_cold:>10.3f} {(n + 1) / t_cold:>14.1f} {cached:>9}"
                  f"   (warm request {t_warm:.3f} s)")
    finally:
        srv.terminate()
        srv.wait()
    print(f"log: {log}")


if __name__ == "__main__":
    main()
