#!/usr/bin/env python3
"""Lua memory allocated per spend (an admit at cost 1 on a sliding window,
with the status page's history), by the spend core by FCALL, the same files
as one script (EVAL, as on Redis 6), and lua/spend.lua as it was before the
function library (tests/support/fixtures/spend_before_33.lua).

What a call allocates is paid again in Lua's garbage collection, so this is
where a call's Lua time goes (BENCHMARKS.md section 9). Each call is
measured inside Redis with collectgarbage('count') around it, the collector
stopped meanwhile: a probe function appended to the library, the scripts
wrapped the same way. The median of 200 calls after 300 warm-up calls.

Usage: benches/alloc/alloc.py BINARY   (redis-py: benches/peers/run --install)
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import redis

from common import BEFORE, CONFIG, quota_worker  # noqa: E402

PROBE = """
redis.register_function('probe', function(k, a)
  local c0 = collectgarbage('count')
  collectgarbage('stop')
  local r = Ops.spend(k, a)
  local d = collectgarbage('count') - c0
  collectgarbage('restart')
  return tostring(d)
end)
"""


def wrap(text, last):
    """The script with its last line's call measured."""
    body = text.rstrip()
    assert body.endswith(last), body[-200:]
    call = last[len("return "):]
    return ("local __c0 = collectgarbage('count') collectgarbage('stop')\n"
            + body[: -len(last)]
            + f"local __r = {call} local __d = collectgarbage('count') - __c0 "
            + "collectgarbage('restart') return tostring(__d)\n")


def main():
    binary = sys.argv[1]
    work = tempfile.mkdtemp(prefix="qw-alloc-")
    with open(os.path.join(work, "secret"), "w") as f:
        f.write("x\n")
    cfg = os.path.join(work, "qw.toml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(dir=work))
    spec = json.loads(quota_worker(binary, cfg, "keys", "an"))
    library = quota_worker(binary, cfg, "keys", "--library") + PROBE
    script = wrap(quota_worker(binary, cfg, "keys", "--script"), "return op(KEYS, ARGV)")
    with open(BEFORE) as f:
        before = wrap(f.read(), "return spend_main(KEYS, ARGV)")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", work],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(200):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        keys, args = spec["keys"], spec["args"]

        def argv():
            return [args[0], uuid.uuid4().hex] + args[2:]

        r.execute_command("FUNCTION", "LOAD", "REPLACE", library)
        calls = {
            "spend core (FCALL)": lambda: r.execute_command("FCALL", "probe", len(keys), *keys, *argv()),
            "spend core as one script (EVAL)": lambda: r.eval(script, len(keys), *keys, *argv()),
            "before: spend.lua (EVAL)": lambda: r.eval(before, len(keys), *keys, *argv()),
        }
        print(f"Redis {r.info('server')['redis_version']}; KB of Lua memory allocated per admit, cost 1, sliding window, history kept")
        print("| call | KB per call (median of 200) | min | max |")
        print("|---|---:|---:|---:|")
        for name, call in calls.items():
            for _ in range(300):
                call()
            kb = [float(call()) for _ in range(200)]
            print(f"| {name} | {statistics.median(kb):.2f} | {min(kb):.2f} | {max(kb):.2f} |")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
