#!/usr/bin/env python3
"""Starts a private redis-server on a loopback port (no persistence), runs redis-benchmark
against it and prints the result as the document `gleaner bench` writes (BenchDoc, one run
whose items are the requests and throughput the requests per second), for `gleaner compare`:

    gleaner compare --policies stock,haltpoll,naive,gleaner -- scripts/bench/redis-doc.py 50 200000
    gleaner compare ... -- scripts/bench/redis-doc.py lat 3     # one connection: latency

Arguments: clients (-c, default 50), requests (-n, default 200000). Tests SET and GET; the
throughput is their mean requests/s. A benchmark harness: it reads redis-benchmark's CSV.
`lat SECONDS`: the client is `kv-latency.c` (this folder), a closed loop of one connection
GETting one 100-byte value, and the result its request latency (mean and percentiles)."""

import csv
import io
import os
import subprocess
import sys
import tempfile
import time

from benchdoc import print_doc, print_kv_latency


def main():
    clients = sys.argv[1] if len(sys.argv) > 1 else "50"
    latency = clients == "lat"
    if latency:
        secs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
        if secs < 1:
            sys.exit(f"seconds {secs}: must be at least 1")
    else:
        requests = int(sys.argv[2]) if len(sys.argv) > 2 else 200000
    port = str(16379 + os.getpid() % 1000)
    with tempfile.TemporaryDirectory() as d:
        # Latency: the server on CPU 1, its client on CPU 0, so every request crosses vCPUs.
        pin = ["taskset", "-c", "1"] if latency else []
        server = subprocess.Popen(pin + ["redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                   "--dir", d, "--daemonize", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                if subprocess.run(["redis-cli", "-p", port, "ping"], capture_output=True, text=True).stdout.strip() == "PONG":
                    break
                time.sleep(0.05)
            if latency:
                print_kv_latency("redis", port, secs)
                return
            t0 = time.monotonic_ns()
            out = subprocess.run(["redis-benchmark", "-p", port, "-c", clients, "-n", str(requests), "-t", "set,get", "--csv", "-q"],
                                 capture_output=True, text=True, check=True).stdout
            wall = time.monotonic_ns() - t0
        finally:
            server.terminate()
            server.wait()
    rows = [r for r in csv.reader(io.StringIO(out)) if r and r[0] != "test"]
    rps = [float(r[1]) for r in rows]
    tput = sum(rps) / len(rps)
    print_doc(f"redis-benchmark -c {clients} -n {requests} -t set,get", {"clients": clients, "requests": requests}, wall, 2 * requests, tput)


if __name__ == "__main__":
    main()
