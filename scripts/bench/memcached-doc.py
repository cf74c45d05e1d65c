#!/usr/bin/env python3
"""Starts a private memcached (its default 4 worker threads, on CPU 1, loopback) and loads it
from CPU 0, printing the result as the document `gleaner bench` writes (BenchDoc, one run),
for `gleaner compare`:

    gleaner compare --policies stock,haltpoll,naive,gleaner -- scripts/bench/memcached-doc.py 1 3    # 1 connection: latency
    gleaner compare ... -- scripts/bench/memcached-doc.py 50 3                                        # 50 connections: throughput

Arguments: connections (default 1), seconds (default 3). With one connection the client is
`kv-latency.c` (this folder): a closed loop of GETs of one 100-byte value, whose request
latency (mean and percentiles) is the result; with more it is memcaslap (`-T 1 -c N`, 90%
GET, 10% SET) and the result its operations a second. A benchmark harness, not part of
gleaner. Needs the Debian packages memcached and libmemcached-tools, and a C compiler."""

import os
import re
import subprocess
import sys
import time

from benchdoc import conns_and_secs, print_doc, print_kv_latency, wait_for_port


def main():
    conns, secs = conns_and_secs(sys.argv)
    port = 21211 + os.getpid() % 1000
    server = subprocess.Popen(["taskset", "-c", "1", "memcached", "-u", "nobody", "-l", "127.0.0.1", "-p", str(port), "-U", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, server, "memcached")
        if conns == 1:
            print_kv_latency("memcached", port, secs)
            return
        t0 = time.monotonic_ns()
        out = subprocess.run(["taskset", "-c", "0", "memcaslap", "-s", f"127.0.0.1:{port}", "-T", "1", "-c", str(conns), "-t", f"{secs}s"],
                             capture_output=True, text=True, check=True).stdout
        wall = time.monotonic_ns() - t0
    finally:
        server.terminate()
        server.wait()
    m = re.search(r"Ops: (\d+) TPS: (\d+)", out)
    if m is None:
        sys.exit(f"memcaslap printed no totals: {out.strip()[-300:]!r}")
    print_doc(f"memcached + memcaslap -T 1 -c {conns} -t {secs}s", {"connections": conns, "seconds": secs}, wall, int(m.group(1)),
              float(m.group(2)))


if __name__ == "__main__":
    main()
