"""Another program with the same token: GETs from the simulator, nothing else.

Usage: other_client.py BASE_URL TOKEN PATH COUNT [QUERY]

Sends COUNT requests `GET BASE_URL PATH?who=other&QUERY` with
`Authorization: Bearer TOKEN`, one after the other (the standard library
only), and prints one JSON object: {"statuses": {"200": n, "403": m, ...}}.
The simulator counts them on the token's meters like quota-worker's own; the
`who=other` parameter tells them apart in its request log.
"""

import json
import sys
import urllib.error
import urllib.request


def main():
    base, token, path, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    extra = sys.argv[5] if len(sys.argv) > 5 else ""
    url = base + path + "?who=other" + ("&" + extra if extra else "")
    statuses = {}
    for _ in range(count):
        req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                code = r.status
                r.read()
        except urllib.error.HTTPError as e:
            code = e.code
            e.read()
        statuses[str(code)] = statuses.get(str(code), 0) + 1
    print(json.dumps({"statuses": statuses}))


if __name__ == "__main__":
    main()
