#!/usr/bin/env python3
"""quota-worker's spend core beside the peers of benches/baseline/, on equal
work, in one run (BENCHMARKS.md section 1, "Against the peers").

Server-side: redis-benchmark (50 clients, a random request id per call)
runs each implementation's one call; spends/s and Redis's own µs per call
(INFO commandstats). Through a client: redis-py, 4 threads, one connection
each, as an application calls it; calls/s and p50/p99 latency. Rounds are
interleaved; each cell is the median of its rounds, and a ratio is taken
round by round (ours / the best peer of that round) and its median reported.

Implementations (the same windows and units for all):
  ours            the spend core by FCALL (lua/spend/, the function library)
  ours, EVALSHA   the same files as one script (Redis 6, or no FUNCTION)
  before          lua/spend.lua as it was before issue 33 (tests/support/
                  fixtures/spend_before_33.lua), by EVALSHA
  naive log       benches/baseline/naive_log.lua (one zset member per unit)
  moving window   benches/baseline/moving_window_list.lua (Python limits'
                  moving window: one list entry per unit)
  two-zset dual   benches/baseline/two_zset_dual.lua (two windows, cost 1)
  layout floor    benches/baseline/layout_floor.lua: only the calls an admit
                  in our layout must make, checking nothing (not a peer: the
                  best any script on our keys can do; admit cell only)
Ours spends without the status page's history (as the peers keep none).

Usage: bench.py BINARY [--quick] [--rounds N] [--out DIR]
"""

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import redis

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BASELINE = os.path.join(ROOT, "benches", "baseline")
BEFORE = os.path.join(ROOT, "tests", "support", "fixtures", "spend_before_33.lua")
HUGE = 1_000_000_000
FULL = 10_000
HOUR_MS = 3_600_000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A private redis-server on 127.0.0.1, stopped by its pid."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="qw-peers-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--logfile", os.path.join(self.dir, "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                redis.Redis(port=self.port).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        self.version = redis.Redis(port=self.port).info("server")["redis_version"]

    def client(self):
        return redis.Redis(port=self.port, single_connection_client=True)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def commandstats(r):
    return {k[len("cmdstat_"):] if k.startswith("cmdstat_") else k: v
            for k, v in r.info("commandstats").items()}


CONFIG = """
[redis]
url = "redis://127.0.0.1:{port}/0"
key_prefix = "pb"

[credentials.admit]
secret_env = "PB"
windows = [{{ units = {huge}, per = "1h" }}]
[endpoints.admit]
credential = "admit"
cost = 1

[credentials.full1]
secret_env = "PB"
windows = [{{ units = {full}, per = "1h" }}]
[endpoints.full1]
credential = "full1"
cost = 1

[credentials.full100]
secret_env = "PB"
windows = [{{ units = {full}, per = "1h" }}]
[endpoints.full100]
credential = "full100"
cost = 1

[credentials.dual]
secret_env = "PB"
windows = [{{ units = {huge}, per = "5s" }}, {{ units = {huge}, per = "60s" }}]
[endpoints.dual]
credential = "dual"
cost = 1
"""


class Ours:
    """How to call the spend core on one endpoint, as `keys` prints it,
    without the history (the keys of the windows, ARGV up to the specs)."""

    def __init__(self, binary, config, endpoint):
        out = subprocess.run([binary, "--config", config, "keys", endpoint],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "PB": "x"})
        spec = json.loads(out.stdout)
        n = int(spec["args"][4])
        nkeys = 2 + sum({"sliding": 4, "bucket": 4, "fixed": 1, "concurrent": 3}[a.split(":")[0]]
                        for a in spec["args"][5:5 + n])
        self.keys = spec["keys"][:nkeys]
        self.args = spec["args"][:5 + n]
        self.function = spec["fcall"]["function"]
        with open(spec["script"]) as f:
            self.script = f.read()


def load(r, path):
    with open(path) as f:
        return r.script_load(f.read())


class Impl:
    """One implementation's call in one cell: its redis-benchmark command
    (with __rand_int__ for the unique id) and a redis-py call."""

    def __init__(self, name, top, cmd):
        self.name, self.top, self.cmd = name, top, cmd

    def bench_args(self):
        return [a.replace("{id}", "id:__rand_int__") for a in self.cmd]

    def call(self, r, rid):
        return r.execute_command(*[a.replace("{id}", rid) for a in self.cmd])


def ours_cmd(o, cost, how, sha=None):
    args = list(o.args)
    args[1], args[2] = "{id}", str(cost)
    if how == "fcall":
        return ["FCALL", o.function, str(len(o.keys))] + o.keys + args
    return ["EVALSHA", sha, str(len(o.keys))] + o.keys + args


def cells(r, o, shas):
    """Every cell: (name, cost, [Impl...], is it a refusal)."""
    def ours(endpoint, cost):
        e = o[endpoint]
        return [Impl("ours", "fcall", ours_cmd(e, cost, "fcall")),
                Impl("ours, EVALSHA", "evalsha", ours_cmd(e, cost, "evalsha", shas["script"])),
                Impl("before (spend.lua)", "evalsha", ours_cmd(e, cost, "evalsha", shas["before"]))]

    def naive(key, limit, cost):
        return Impl("naive log", "evalsha", ["EVALSHA", shas["naive"], "1", key, "{id}", str(cost), str(limit), str(HOUR_MS)])

    def moving(key, limit, cost):
        return Impl("moving window", "evalsha", ["EVALSHA", shas["moving"], "1", key, str(limit), str(HOUR_MS), str(cost)])

    floor = Impl("layout floor", "evalsha", ["EVALSHA", shas["floor"], "5"] +
                 [f"pf:{{a}}:{k}" for k in ["block", "clock", "meta", "log", "ts"]] + ["{id}", "1"])
    dual = Impl("two-zset dual", "evalsha", ["EVALSHA", shas["dual"], "2", "pd:{d}:s", "pd:{d}:l", "{id}", str(HUGE), "5000", str(HUGE), "60000"])
    return [
        ("admit, cost 1", 1, ours("admit", 1) + [floor, naive("pn:{a}", HUGE, 1), moving("pm:{a}", HUGE, 1)], False),
        ("refuse, cost 1 (10,000 entries of 1)", 1, ours("full1", 1) + [naive("pn:{f1}", FULL, 1), moving("pm:{f1}", FULL, 1)], True),
        ("refuse, cost 100 (100 entries of 100)", 100, ours("full100", 100) + [naive("pn:{f100}", FULL, 100), moving("pm:{f100}", FULL, 100)], True),
        ("refuse, cost 100 (10,000 entries of 1)", 100, ours("full1", 100) + [naive("pn:{f1}", FULL, 100), moving("pm:{f1}", FULL, 100)], True),
        ("two windows (5 s + 60 s), admit cost 1", 1, ours("dual", 1) + [dual], False),
        ("admit, cost 100", 100, ours("admit", 100) + [naive("pn:{a100}", HUGE, 100), moving("pm:{a100}", HUGE, 100)], False),
    ]


def fill(r, o, shas):
    """The refusals' windows, exactly full, each implementation's own."""
    p = r.pipeline(transaction=False)
    for i in range(FULL):
        Impl("", "", ours_cmd(o["full1"], 1, "fcall")).call(p, f"f1-{i}")
        p.evalsha(shas["naive"], 1, "pn:{f1}", f"f1-{i}", 1, FULL, HOUR_MS)
        p.evalsha(shas["moving"], 1, "pm:{f1}", FULL, HOUR_MS, 1)
        if len(p) >= 3000:
            p.execute()
    for i in range(FULL // 100):
        Impl("", "", ours_cmd(o["full100"], 100, "fcall")).call(p, f"f100-{i}")
        p.evalsha(shas["naive"], 1, "pn:{f100}", f"f100-{i}", 100, FULL, HOUR_MS)
        p.evalsha(shas["moving"], 1, "pm:{f100}", FULL, HOUR_MS, 100)
    p.execute()
    assert r.zcard("pn:{f1}") == FULL and r.llen("pm:{f1}") == FULL
    assert r.zcard("pn:{f100}") == FULL and r.llen("pm:{f100}") == FULL


def server_side(srv, impl, n, clients):
    """redis-benchmark: spends/s, and Redis µs per call of its command."""
    r = srv.client()
    r.config_resetstat()
    out = subprocess.run(
        ["redis-benchmark", "-p", str(srv.port), "-c", str(clients), "-n", str(n),
         "-r", "1000000000", "--csv"] + impl.bench_args(),
        capture_output=True, text=True, check=True).stdout
    rps = float(out.strip().splitlines()[-1].split(",")[1].strip('"'))
    st = commandstats(r).get(impl.top, {})
    usec = st.get("usec", 0) / max(st.get("calls", 1), 1)
    failed = st.get("failed_calls", 0)
    assert failed == 0, f"{impl.name}: {failed} failed calls"
    return rps, usec


def through_client(srv, impl, seconds, threads):
    """redis-py, `threads` threads with a connection each: calls/s, p50 and
    p99 µs."""
    lat, stop = [], time.perf_counter() + seconds
    lock = threading.Lock()

    def run():
        r = srv.client()
        mine = []
        while time.perf_counter() < stop:
            rid = uuid.uuid4().hex
            t0 = time.perf_counter()
            impl.call(r, rid)
            mine.append(time.perf_counter() - t0)
        with lock:
            lat.extend(mine)

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    lat.sort()
    q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] * 1e6
    return len(lat) / seconds, q(0.50), q(0.99)


def median(v):
    return statistics.median(v) if v else float("nan")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "peers-bench"))
    a = ap.parse_args()
    n, secs, rounds = (2_000, 1.0, 1) if a.quick else (30_000, 4.0, a.rounds)
    started = time.time()
    load_start = loadavg()
    srv = Server()
    try:
        tmp = tempfile.mkdtemp(prefix="qw-peers-cfg-")
        cfg = os.path.join(tmp, "quota-worker.toml")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(port=srv.port, huge=HUGE, full=FULL))
        o = {e: Ours(a.binary, cfg, e) for e in ["admit", "full1", "full100", "dual"]}
        r = srv.client()
        shas = {
            "script": r.script_load(o["admit"].script),
            "before": load(r, BEFORE),
            "naive": load(r, os.path.join(BASELINE, "naive_log.lua")),
            "moving": load(r, os.path.join(BASELINE, "moving_window_list.lua")),
            "dual": load(r, os.path.join(BASELINE, "two_zset_dual.lua")),
            "floor": load(r, os.path.join(BASELINE, "layout_floor.lua")),
        }
        # The library, loaded as the daemon loads it (one spend through it).
        with open(os.path.join(tmp, "lib.lua"), "w") as f:
            f.write(subprocess.run([a.binary, "--config", cfg, "keys", "--library"], capture_output=True,
                                   text=True, check=True, env={**os.environ, "PB": "x"}).stdout)
        r.function_load(open(os.path.join(tmp, "lib.lua")).read(), replace=True)
        fill(r, o, shas)
        table = cells(r, o, shas)
        results = []
        for name, cost, impls, refusal in table:
            cell = {"cell": name, "cost": cost, "refusal": refusal, "server": {}, "client": {}}
            for rnd in range(rounds):
                order = impls[rnd % len(impls):] + impls[:rnd % len(impls)]
                for impl in order:
                    rps, usec = server_side(srv, impl, n, 50)
                    cell["server"].setdefault(impl.name, []).append({"rps": rps, "usec": usec})
                if cost == 1:
                    for impl in order:
                        cps, p50, p99 = through_client(srv, impl, secs, 4)
                        cell["client"].setdefault(impl.name, []).append({"cps": cps, "p50": p50, "p99": p99})
            results.append(cell)
            print(f"{name}: done", file=sys.stderr)
        meta = {
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            "seconds": round(time.time() - started),
            "load_start": load_start, "load_end": loadavg(),
            "redis": srv.version, "redis_py": redis.__version__,
            "machine": f"{os.cpu_count()} cores, {platform.machine()}",
            "rounds": rounds, "requests": n, "client_seconds": secs,
            "library": o["admit"].function.rsplit("_", 1)[0],
        }
    finally:
        srv.stop()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump({"meta": meta, "cells": results}, f, indent=1)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(report(meta, results))
    print(os.path.join(a.out, "report.md"))


PEERS = ["naive log", "moving window", "two-zset dual"]
OURS = ["ours", "ours, EVALSHA", "before (spend.lua)", "layout floor"]


def ratio(cell, side, name, key):
    """Median over rounds of `name` ÷ the best peer of the same round."""
    rows = cell[side]
    peers = [p for p in PEERS if p in rows]
    out = []
    for i in range(len(rows[name])):
        best = max(rows[p][i][key] for p in peers)
        out.append(rows[name][i][key] / best)
    return median(out), min(out), max(out)


def report(meta, results):
    m = meta
    s = [f"# The spend core beside its peers\n\nRun {m['started']}, {m['seconds']} s; Redis {m['redis']}, "
         f"redis-py {m['redis_py']}; {m['machine']}; load average {m['load_start']} at the start, "
         f"{m['load_end']} at the end; library `{m['library']}`. {m['rounds']} interleaved rounds; "
         f"{m['requests']:,} requests per implementation and cell server-side (redis-benchmark, 50 clients), "
         f"{m['client_seconds']:.0f} s per implementation and cell through redis-py (4 threads, a connection each). "
         "A cell is the median of its rounds; a ratio is ours ÷ the best peer, taken round by round, median "
         "(the rounds' range in brackets).\n\n"]
    s.append("## Server-side (redis-benchmark, 50 clients)\n\n| cell | " + " | ".join(OURS + PEERS) +
             " | ours ÷ best peer | before ÷ best peer |\n|---|" + "---:|" * (len(OURS) + len(PEERS) + 2) + "\n")
    for c in results:
        row = [c["cell"]]
        for name in OURS + PEERS:
            v = c["server"].get(name)
            row.append(f"{median([x['rps'] for x in v]):,.0f}/s ({median([x['usec'] for x in v]):.1f} µs)" if v else "")
        for name in ["ours", "before (spend.lua)"]:
            r, lo, hi = ratio(c, "server", name, "rps")
            row.append(f"**{r:.2f}×** ({lo:.2f}–{hi:.2f})")
        s.append("| " + " | ".join(row) + " |\n")
    s.append("\nIn brackets: Redis's own µs per call (`INFO commandstats`, the `FCALL` or `EVALSHA` itself, "
             "its commands included).\n\n## Through a client (redis-py, 4 threads, one connection each), cost 1\n\n"
             "| cell | " + " | ".join(OURS + PEERS) + " | ours ÷ best peer | before ÷ best peer |\n|---|" +
             "---:|" * (len(OURS) + len(PEERS) + 2) + "\n")
    for c in results:
        if not c["client"]:
            continue
        row = [c["cell"]]
        for name in OURS + PEERS:
            v = c["client"].get(name)
            row.append(f"{median([x['cps'] for x in v]):,.0f}/s (p99 {median([x['p99'] for x in v]) / 1000:.2f} ms)" if v else "")
        for name in ["ours", "before (spend.lua)"]:
            r, lo, hi = ratio(c, "client", name, "cps")
            row.append(f"**{r:.2f}×** ({lo:.2f}–{hi:.2f})")
        s.append("| " + " | ".join(row) + " |\n")
    return "".join(s)


if __name__ == "__main__":
    main()
