"""What benches/alloc's two measures share: where things are, the config
their spend core is printed from, and running quota-worker on it."""

import os
import socket
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# spend.lua as it was before issue 33: the baseline both measures stand beside.
BEFORE = os.path.join(ROOT, "tests", "support", "fixtures", "spend_before_33.lua")
# One sliding window no spend fills: every measured call is an admit.
CONFIG = """
[redis]
url = "redis://127.0.0.1:1/0"
[credentials.k]
secret_file = "{dir}/secret"
windows = [ {{ units = 1000000000, per = "1h" }} ]
[endpoints.an]
credential = "k"
cost = 1
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quota_worker(binary, cfg, *args):
    """`quota-worker ARGS -c CFG`'s standard output."""
    return subprocess.run([binary, *args, "-c", cfg], check=True, capture_output=True).stdout.decode()
