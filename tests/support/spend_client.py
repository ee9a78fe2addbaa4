"""A second client of lua/spend.lua, written only from `quota-worker keys`.

Usage: spend_client.py KEYS_JSON REDIS_PORT REQUEST_ID [--raw] [--settle COST] [--fcall]

Reads the JSON `keys` printed, loads the script file it names, substitutes
REQUEST_ID for the literal "{request_id}" (unless --raw), and calls EVALSHA,
falling back to EVAL on NOSCRIPT, over a minimal RESP client on 127.0.0.1
(the standard library only). Prints {"reply": [...]} or {"error": "..."}.
With --settle COST it settles that spend instead, with the keys and args of
the JSON's "settle" object ({cost} replaced by COST): what returns the lease
a spend took on an endpoint with a concurrent window. With --fcall it calls
the function `keys` names (FCALL, Redis 7) instead, and the script where the
function is not loaded; "via" says which ran.
"""

import hashlib
import json
import socket
import sys


class RedisError(Exception):
    pass


def command(sock, reader, *args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    sock.sendall(b"".join(out))
    return read_reply(reader)


def read_reply(reader):
    line = reader.readline()
    if not line.endswith(b"\r\n"):
        raise RedisError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RedisError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else reader.read(n + 2)[:-2].decode()
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [read_reply(reader) for _ in range(n)]
    raise RedisError("unexpected reply %r" % line)


def main():
    spec_path, port, request_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rest = sys.argv[4:]
    raw = "--raw" in rest
    with open(spec_path) as f:
        spec = json.load(f)
    with open(spec["script"], "rb") as f:
        script = f.read()
    sha = hashlib.sha1(script).hexdigest()
    call = spec
    values = {"{request_id}": request_id}
    if "--settle" in rest:
        call = spec["settle"]
        values["{cost}"] = rest[rest.index("--settle") + 1]
    args = call["args"] if raw else [values.get(a, a) for a in call["args"]]
    keys = call["keys"]
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    reader = sock.makefile("rb")
    try:
        via = "evalsha"
        if "--fcall" in rest:
            # The function, as `keys` prints it; where it is not loaded,
            # the script (the fallback other-languages.md describes).
            try:
                fn = call["fcall"]["function"]
                reply = command(sock, reader, "FCALL", fn, len(keys), *keys, *args)
                via = "fcall"
            except RedisError as e:
                if "Function not found" not in str(e):
                    raise
        if via == "evalsha":
            try:
                reply = command(sock, reader, "EVALSHA", sha, len(keys), *keys, *args)
            except RedisError as e:
                if not str(e).startswith("NOSCRIPT"):
                    raise
                reply = command(sock, reader, "EVAL", script, len(keys), *keys, *args)
        print(json.dumps({"reply": reply, "sha1": sha, "via": via}))
    except RedisError as e:
        print(json.dumps({"error": str(e), "sha1": sha}))
    finally:
        sock.close()


if __name__ == "__main__":
    main()
