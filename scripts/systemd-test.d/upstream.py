#!/usr/bin/env python3
"""The upstream API of scripts/systemd-test, run inside its container.

A YouTube-videos.list-shaped JSON endpoint on 127.0.0.1 that records every
request (its key, region, start and end) as one JSON line per event, so the
probe can tell which credential reached the upstream and whether a request
that was in flight when the service stopped was answered. Responses are
slowed down by writing "SECONDS" (all of them) or "SECONDS REGION,REGION"
(those regionCodes only) into the file DELAY_FILE, read as each request
arrives.

usage: upstream.py PORT LOG_FILE DELAY_FILE
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PORT = int(sys.argv[1])
LOG = sys.argv[2]
DELAY_FILE = sys.argv[3]

lock = threading.Lock()
seq = 0


def record(event):
    event["t"] = time.time()
    with lock:
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")


def delay(region):
    try:
        with open(DELAY_FILE, encoding="utf-8") as f:
            words = f.read().split()
    except FileNotFoundError:
        return 0.0
    if not words:
        return 0.0
    if len(words) > 1 and region not in words[1].split(","):
        return 0.0
    return float(words[0])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (http.server's naming)
        global seq
        with lock:
            seq += 1
            n = seq
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        region = q.get("regionCode", "")
        record({"event": "start", "seq": n, "path": url.path, "key": q.get("key"), "region": region})
        time.sleep(delay(region))
        items = [{"id": f"req{n}-item{i}", "region": region} for i in range(3)]
        body = json.dumps({"kind": "youtube#videoListResponse", "items": items}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            record({"event": "end", "seq": n, "sent": True})
        except OSError as e:
            record({"event": "end", "seq": n, "sent": False, "error": str(e)})

    def log_message(self, *args):
        pass


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
