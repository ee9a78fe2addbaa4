#!/usr/bin/env python3
"""Shadow windows cost nothing when absent (issue 35, BENCHMARKS.md §18).

Redis CPU per spend, by BENCHMARKS.md §9's method: `INFO commandstats`
reset before each measurement, the µs per `FCALL` Redis reports, callers on
one server (redis-benchmark, 16 connections), interleaved rounds (the order
rotated each round), the median of each round's ratio to "before". Beside
it, the redis-server process's own CPU time (user + system, from
/proc/<pid>/stat) per call: commandstats times a call by the wall clock, so
on a loaded machine a call that is preempted counts the time it waited; the
process's CPU time does not (it adds the network's share, the same for
every call). Three libraries of the spend core, loaded side by side in one
redis-server:

- before: lua/spend/ as it was before shadow windows (git ref BEFORE,
  default i33), assembled as src/quota/library.rs assembles it;
- after:  the tree's lua/spend/;
- after, with a shadow window: the same spend with one more window, a
  shadow one (what the feature costs where it is used), beside the same
  spend with that second window enforced.

Each spends cost 1 on windows that always admit, on keys of its own, and
writes the spend history (one ring), as the daemon's spends do. Only the
Python standard library, redis-cli and redis-benchmark.

    benches/shadow/bench.py [--rounds 5] [--requests 100000] [--before REF]
"""

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# src/quota/library.rs's order: core.lua, then each module in a block of
# its own, the claim, then functions.lua.
MODULES = [
    ["log.lua", "adjust.lua"],
    ["sliding.lua"],
    ["bucket.lua"],
    ["fixed.lua"],
    ["concurrent.lua"],
    ["line.lua"],
    ["ring.lua"],
    ["ops.lua"],
]


def read(ref, path):
    if ref is None:
        with open(os.path.join(ROOT, path)) as f:
            return f.read()
    return subprocess.run(
        ["git", "-C", ROOT, "show", f"{ref}:{path}"],
        check=True, capture_output=True, text=True,
    ).stdout


def library(ref, name):
    body = read(ref, "lua/spend/core.lua")
    for files in MODULES:
        body += "do\n" + "".join(read(ref, "lua/spend/" + f) for f in files) + "end\n"
    body += "do\n" + read(ref, "lua/item_lock.lua") + read(ref, "lua/spend/claim.lua") + "end\n"
    body += read(ref, "lua/spend/functions.lua")
    return f"#!lua name={name}\nlocal LIBRARY = '{name}'\n{body}"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cli(port, *args, stdin=None):
    return subprocess.run(
        ["redis-cli", "-p", str(port), *args],
        check=True, capture_output=True, text=True, input=stdin,
    ).stdout


def spend_args(name, cred, second):
    """FCALL <lib>_spend with one sliding window, and `second` (None, "shadow"
    or "enforce") a second one of the same period, keyed by its units."""
    t = "{" + cred + "}"
    keys = [f"b:{t}:blocked", f"b:{t}:clock"]
    keys += [f"b:{t}:cred:s3600000:v2:{k}" for k in ("meta", "log", "ts", "adj")]
    specs = ["sliding:1000000000000:3600000"]
    if second:
        keys += [f"b:{t}:cred:s3600000:u900000000000:v2:{k}" for k in ("meta", "log", "ts", "adj")]
        if second == "shadow":
            keys.append(f"b:{t}:cred:s3600000:u900000000000:shadow")
            specs.append("shadow:sliding:900000000000:3600000")
        else:
            specs.append("sliding:900000000000:3600000")
    keys.append(f"b:{t}:spent:cred")
    argv = ["spend", "r-__rand_int__", "1", "0", str(len(specs)), *specs,
            "1", "300000", "288", "86700000"]
    return [f"{name}_spend", str(len(keys)), *keys, *argv]


def cpu_s(pid):
    """User + system CPU seconds of process `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fcall_us(port):
    for line in cli(port, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_fcall:"):
            return float(re.search(r"usec_per_call=([\d.]+)", line).group(1))
    raise SystemExit("no FCALL in commandstats")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=100000)
    ap.add_argument("--before", default="i33")
    a = ap.parse_args()
    port = free_port()
    d = tempfile.mkdtemp(prefix="qw-shadow-bench-")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", d],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                if cli(port, "PING").strip() == "PONG":
                    break
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.05)
        before_ref = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", a.before],
                                    check=True, capture_output=True, text=True).stdout.strip()
        after_ref = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                   check=True, capture_output=True, text=True).stdout.strip()
        cli(port, "-x", "FUNCTION", "LOAD", stdin=library(a.before, "qwbefore"))
        cli(port, "-x", "FUNCTION", "LOAD", stdin=library(None, "qwafter"))
        calls = {
            f"before ({before_ref}), one window": spend_args("qwbefore", "before", None),
            f"after ({after_ref}), one window": spend_args("qwafter", "after", None),
            "after, a window and a shadow window": spend_args("qwafter", "shadowed", "shadow"),
            "after, two enforced windows": spend_args("qwafter", "two", "enforce"),
        }
        # Each call answers as it should before it is timed.
        for label, args in calls.items():
            out = cli(port, "FCALL", *[x.replace("__rand_int__", "0") for x in args])
            assert out.split()[0] == "1", (label, out)
        results = {label: [] for label in calls}
        cpu = {label: [] for label in calls}
        labels = list(calls)
        for r in range(a.rounds):
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                cli(port, "CONFIG", "RESETSTAT")
                t0 = cpu_s(server.pid)
                subprocess.run(
                    ["redis-benchmark", "-p", str(port), "-c", "16", "-n", str(a.requests),
                     "-r", "1000000000000", "-q", "FCALL", *calls[label]],
                    check=True, capture_output=True,
                )
                cpu[label].append((cpu_s(server.pid) - t0) * 1e6 / a.requests)
                results[label].append(fcall_us(port))
        first, first_cpu = results[labels[0]], cpu[labels[0]]
        print(f"redis-server {cli(port, 'INFO', 'server').split('redis_version:')[1].split()[0]}, "
              f"{a.rounds} rounds of {a.requests} FCALLs, 16 connections, load average "
              f"{os.getloadavg()[0]:.1f}; medians over the rounds")
        print()
        print("| spend, cost 1, admitted | commandstats µs per call | ÷ before (rounds' ratios) | process CPU µs per call | ÷ before (rounds' ratios) |")
        print("|---|---:|---:|---:|---:|")
        for label in labels:
            us, c = results[label], cpu[label]
            ratio = statistics.median(u / b for u, b in zip(us, first))
            cratio = statistics.median(u / b for u, b in zip(c, first_cpu))
            print(f"| {label} | {statistics.median(us):.2f} | {ratio:.3f}× | "
                  f"{statistics.median(c):.2f} | {cratio:.3f}× |")
        print()
        for label in labels:
            print(f"- {label}: commandstats {', '.join(f'{u:.1f}' for u in results[label])}; "
                  f"CPU {', '.join(f'{u:.1f}' for u in cpu[label])}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
