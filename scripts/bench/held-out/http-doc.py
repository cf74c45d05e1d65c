#!/usr/bin/env python3
"""Starts an HTTP server (SERVER..., its `{port}` replaced by a free loopback port), loads it
with wrk for SECS seconds with CONNS connections, neither pinned (as a tenant runs them), and
prints the result as the document `gleaner bench` writes: the request latency with one or two
connections, the requests a second with more.

    http-doc.py CONNS SECS SERVER...     e.g. http-doc.py 1 3 node server.js {port}

A benchmark harness for held-out.sh. Needs the Debian package wrk."""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchdoc import conns_and_secs, print_wrk_doc, run_wrk, wait_for_url  # noqa: E402


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: http-doc.py CONNS SECS SERVER... (SERVER's {port} is replaced)")
    conns, secs = conns_and_secs(sys.argv[:3])
    port = 19080 + os.getpid() % 1000
    cmd = [a.replace("{port}", str(port)) for a in sys.argv[3:]]
    url = f"http://127.0.0.1:{port}/"
    with tempfile.TemporaryDirectory(prefix="gleaner-http-") as d:
        # Its stderr to a file, not a pipe no one reads while it serves (a full pipe would
        # stall a server that logs).
        err = os.path.join(d, "server.err")
        with open(err, "wb") as f:
            server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f)
        try:
            wait_for_url(url, server, cmd[0], err)
            r = run_wrk(conns, secs, url, d)
        finally:
            server.terminate()
            server.wait()
    print_wrk_doc(os.path.basename(cmd[0]), conns, secs, r, latency_up_to=2)


if __name__ == "__main__":
    main()
