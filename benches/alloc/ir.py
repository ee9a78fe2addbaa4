#!/usr/bin/env python3
"""Machine instructions Redis runs per call of the spend core, counted by
valgrind's callgrind: the same number on a loaded machine as on a quiet one
(BENCHMARKS.md, "Issue 33": where a call's time goes), so a change to the
Lua can be judged in one run of a minute where timing needs many rounds.

A redis-server runs under callgrind with instrumentation off; for each call
measured, 1,000 calls bring its keys past their first growth (a hash or a
sorted set that leaves its listpack, dictionaries that double and rehash:
a few hundred calls on new keys cost up to twice the later ones), then
instrumentation is switched on for 300 more (sent as one pipeline) and the
instructions counted (the server's whole work: reading the command, the
call, the reply) are divided by 300.

Calls: the spend core by FCALL (`keys --library`) in each cell; the same
files as one script by EVALSHA (`keys --script`, what Redis 6 runs) and
lua/spend.lua as it was before issue 33 (tests/support/fixtures/
spend_before_33.lua) in the cells where the issue compares them; the peers
of benches/baseline/ (their admit cells); and an empty function with the
admit cell's KEYS and ARGV, the price of any FCALL of that shape.

With --before DIR (lua/spend/ of an earlier commit, e.g. `git archive
COMMIT lua/spend lua/item_lock.lua | tar -x -C target/before`), that
version's library and one script are assembled as src/quota/library.rs
assembles them and measured beside this one, in the same run.

Usage: benches/alloc/ir.py BINARY [--n 300] [--before DIR]   (needs valgrind
and redis-py: benches/peers/run --install)
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import redis

from common import BEFORE, CONFIG, ROOT, free_port, quota_worker  # noqa: E402

BASE = os.path.join(ROOT, "benches", "baseline")
HUGE = 1_000_000_000
EMPTY = "#!lua name=irempty\nredis.register_function('ir_empty', function(k, a) return {1, 0, 0, 0} end)\n"


def sliding(w):
    return [f"{w}:v2:meta", f"{w}:v2:log", f"{w}:v2:ts", f"{w}:v2:adj"]


# cell -> (KEYS, ARGV after op, id and cost, cost)
CELLS = {
    "admit, cost 1": (["ir:{c}:b", "ir:{c}:c"] + sliding("ir:{c}:a"), ["0", "1", f"sliding:{HUGE}:3600000"], 1),
    "admit, cost 100": (["ir:{c}:b", "ir:{c}:c"] + sliding("ir:{c}:a100"), ["0", "1", f"sliding:{HUGE}:3600000"], 100),
    "refuse, cost 1 (10,000 entries of 1)": (["ir:{c}:b", "ir:{c}:c"] + sliding("ir:{c}:f"), ["0", "1", "sliding:10000:3600000"], 1),
    "refuse, cost 100 (10,000 entries of 1)": (["ir:{c}:b", "ir:{c}:c"] + sliding("ir:{c}:f"), ["0", "1", "sliding:10000:3600000"], 100),
    "two windows (1 h + 2 h), admit cost 1": (["ir:{c}:b", "ir:{c}:c"] + sliding("ir:{c}:d1") + sliding("ir:{c}:d2"),
                                              ["0", "2", f"sliding:{HUGE}:3600000", f"sliding:{HUGE}:7200000"], 1),
    "bucket, admit cost 1": (["ir:{c}:b", "ir:{c}:c"] + sliding("ir:{c}:bk"), ["0", "1", f"bucket:{HUGE}:3600000"], 1),
    "concurrent (a lease), admit cost 1": (["ir:{c}:b", "ir:{c}:c", "ir:{c}:cc:meta", "ir:{c}:cc:lease", "ir:{c}:cc:held"],
                                           ["0", "1", f"concurrent:{HUGE}:3600000"], 1),
    "fixed (a day), admit cost 1": (["ir:{c}:b", "ir:{c}:c", "ir:{c}:fx:fixed"], ["0", "1", f"fixed:{HUGE}:86400000:0:0"], 1),
    "admit cost 1, history kept": (["ir:{c}:b", "ir:{c}:c"] + sliding("ir:{c}:h") + ["ir:{c}:spent:c"],
                                   ["0", "1", f"sliding:{HUGE}:3600000", "1", "300000", "288", "86700000"], 1),
}
SCRIPT_CELLS = ["admit, cost 1", "two windows (1 h + 2 h), admit cost 1", "concurrent (a lease), admit cost 1",
                "admit cost 1, history kept"]


MODULES = [("Log", ["log.lua", "adjust.lua"]), ("Sliding", ["sliding.lua"]), ("Bucket", ["bucket.lua"]),
           ("Fixed", ["fixed.lua"]), ("Concurrent", ["concurrent.lua"]), ("Line", ["line.lua"]),
           ("Ring", ["ring.lua"]), ("Ops", ["ops.lua"])]


def assemble(d):
    """lua/spend/ at `d` (its lua/item_lock.lua beside it) as src/quota/library.rs
    assembles it: (library, one script). Since issue 33's second commit the
    one script's modules are branches of `fill`; before, loaders of `lazy`."""
    f = lambda n: open(os.path.join(d, n)).read()
    core = f("core.lua")
    lib = core + "".join("do\n" + "".join(f(x) for x in m) + "end\n" for _, m in MODULES)
    lib += "do\n" + open(os.path.join(d, "..", "item_lock.lua")).read() + f("claim.lua") + "end\n" + f("functions.lua")
    name = "qwb_" + str(abs(hash(lib)) % 10**10)
    lib = f"#!lua name={name}\nlocal LIBRARY = '{name}'\n{lib}"
    if "local function lazy(t, load)" in core:
        script = core + "local function modules()\n" + "".join(
            f"lazy({t}, function()\n" + "".join(f(x) for x in m) + "end)\n" for t, m in MODULES) + "end\nmodules()\n"
    else:
        script = core + "fill = function(T)\nif T == nil then\n" + "".join(
            f"elseif T == {t} then\n" + "".join(f(x) for x in m) for t, m in MODULES) + "end\nend\nlazy()\n"
    return lib, name + "_spend", script + f("script.lua")


class Callgrind:
    """A redis-server under callgrind, instrumented on demand."""

    def __init__(self, work):
        self.work, self.port, self.dumps = work, free_port(), 0
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={work}/cg.%p.out",
             "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", work], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.r = redis.Redis(port=self.port)
        for _ in range(600):
            try:
                self.r.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.1)
        raise SystemExit("redis-server under valgrind did not start")

    def control(self, *args):
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], check=True, capture_output=True)

    def per_call(self, calls):
        """Instructions per call of `calls` (argument lists), run as one pipeline."""
        self.control("-z")
        self.control("-i", "on")
        p = self.r.pipeline(transaction=False)
        for c in calls:
            p.execute_command(*c)
        p.execute()
        self.control("-i", "off")
        self.dumps += 1
        self.control("-d", f"m{self.dumps}")
        path = f"{self.work}/cg.{self.proc.pid}.out.{self.dumps}"
        for _ in range(200):
            if os.path.exists(path) and "totals:" in open(path).read():
                break
            time.sleep(0.1)
        for line in open(path):
            if line.startswith("totals:"):
                return int(line.split()[1]) / len(calls)
        raise SystemExit(f"no totals in {path}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--before", help="lua/spend/ of an earlier commit, measured beside")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="qw-ir-", dir=os.path.join(ROOT, "target"))
    with open(os.path.join(work, "secret"), "w") as f:
        f.write("x\n")
    cfg = os.path.join(work, "qw.toml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(dir=work))
    library = quota_worker(a.binary, cfg, "keys", "--library")
    script = quota_worker(a.binary, cfg, "keys", "--script")
    function = json.loads(quota_worker(a.binary, cfg, "keys", "an"))["fcall"]["function"]
    cg = Callgrind(work)
    n, seq = a.n, [0]
    try:
        r = cg.r
        version = r.info("server")["redis_version"]
        r.execute_command("FUNCTION", "LOAD", "REPLACE", EMPTY)
        r.execute_command("FUNCTION", "LOAD", "REPLACE", library)
        sha = {"script": r.script_load(script), "before": r.script_load(open(BEFORE).read())}
        if a.before:
            blib, bfunction, bscript = assemble(a.before)
            r.execute_command("FUNCTION", "LOAD", "REPLACE", blib)
            sha["bscript"] = r.script_load(bscript)
        sha.update({k: r.script_load(open(os.path.join(BASE, k + ".lua")).read())
                    for k in ["naive_log", "moving_window_list", "two_zset_dual", "layout_floor"]})

        def ids():
            seq[0] += 1
            return f"ir{seq[0]}"

        def ours(how, cell):
            keys, rest, cost = CELLS[cell]
            if how == "bfcall":
                keys = [k.replace("ir:", "irb:") for k in keys]
            head = {"fcall": ["FCALL", function], "bfcall": ["FCALL", bfunction if a.before else ""]}.get(
                how, ["EVALSHA", sha.get(how)])
            return lambda: head + [len(keys)] + keys + ["spend", ids(), str(cost)] + rest

        def measure(make):
            for _ in range(10):
                p = r.pipeline(transaction=False)
                for _ in range(100):
                    p.execute_command(*make())
                p.execute()
            return cg.per_call([make() for _ in range(n)])

        # The refusals' window, exactly full (10,000 entries of 1).
        p = r.pipeline(transaction=False)
        full_keys, full_rest, _ = CELLS["refuse, cost 1 (10,000 entries of 1)"]
        for i in range(10_000):
            p.execute_command("FCALL", function, len(full_keys), *full_keys, "spend", f"fill{i}", "1", *full_rest)
            if a.before:
                p.execute_command("FCALL", bfunction, len(full_keys), *[k.replace("ir:", "irb:") for k in full_keys],
                                  "spend", f"fill{i}", "1", *full_rest)
        p.execute()
        keys, rest, _ = CELLS["admit, cost 1"]
        empty = measure(lambda: ["FCALL", "ir_empty", len(keys)] + keys + ["spend", ids(), "1"] + rest)
        rows = []
        for cell in CELLS:
            row = [cell, measure(ours("fcall", cell)), measure(ours("bfcall", cell)) if a.before else None]
            if cell in SCRIPT_CELLS:
                row += [measure(ours("script", cell)), measure(ours("bscript", cell)) if a.before else None,
                        measure(ours("before", cell))]
            else:
                row += [None, None, None]
            rows.append(row)
        peers = [
            ("layout floor, admit cost 1", lambda: ["EVALSHA", sha["layout_floor"], 5, "irf:{a}:block", "irf:{a}:clock",
                                                    "irf:{a}:meta", "irf:{a}:log", "irf:{a}:ts", ids(), "1"]),
            ("naive log, admit cost 1", lambda: ["EVALSHA", sha["naive_log"], 1, "irn:{a}", ids(), "1", HUGE, 3600000]),
            ("moving window (Python limits), admit cost 1",
             lambda: ["EVALSHA", sha["moving_window_list"], 1, "irm:{a}", HUGE, 3600000, "1"]),
            ("moving window, admit cost 100",
             lambda: ["EVALSHA", sha["moving_window_list"], 1, "irm:{a100}", HUGE, 3600000, "100"]),
            ("two-ZSET dual (1 h + 2 h), admit cost 1",
             lambda: ["EVALSHA", sha["two_zset_dual"], 2, "ird:{d}:s", "ird:{d}:l", ids(), HUGE, 3600000, HUGE, 7200000]),
        ]
        peer_rows = [(name, measure(make)) for name, make in peers]
    finally:
        cg.stop()
    k = lambda v: "" if v is None else f"{v / 1000:,.1f}k"
    print(f"Instructions per call (callgrind), Redis {version}, "
          f"library `{function.rsplit('_', 1)[0]}`, {n} calls per cell after 1,000; an empty FCALL of the admit's "
          f"shape: {k(empty)}\n")
    was = f" (`{a.before}`)" if a.before else ""
    print(f"| cell | FCALL | FCALL, earlier{was} | one script (EVALSHA) | one script, earlier | "
          "spend.lua before issue 33 | one script ÷ spend.lua before |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for cell, f, bf, s, bs, b in rows:
        ratio = f"{s / b:.2f}×" if s and b else ""
        print(f"| {cell} | {k(f)} | {k(bf)} | {k(s)} | {k(bs)} | {k(b)} | {ratio} |")
    print("\n| peer | instructions per call |\n|---|---:|")
    for name, v in peer_rows:
        print(f"| {name} | {k(v)} |")


if __name__ == "__main__":
    sys.exit(main())
