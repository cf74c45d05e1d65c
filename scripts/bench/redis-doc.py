#!/usr/bin/env python3
"""Starts a private redis-server on a loopback port (no persistence), runs redis-benchmark
against it and prints the result as the document `gleaner bench` writes (BenchDoc, one run
whose items are the requests and throughput the requests per second), for `gleaner compare`:

    gleaner compare --policies stock,haltpoll,naive,gleaner -- scripts/bench/redis-doc.py 50 200000

Arguments: clients (-c, default 50), requests (-n, default 200000). Tests SET and GET; the
throughput is their mean requests/s. A benchmark harness: it reads redis-benchmark's CSV."""

import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import time


def summary(v):
    return {"n": 1, "mean": v, "min": v, "p10": v, "p50": v, "p90": v, "p99": v, "max": v}


def main():
    clients = sys.argv[1] if len(sys.argv) > 1 else "50"
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 200000
    port = str(16379 + os.getpid() % 1000)
    with tempfile.TemporaryDirectory() as d:
        server = subprocess.Popen(["redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                   "--dir", d, "--daemonize", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                if subprocess.run(["redis-cli", "-p", port, "ping"], capture_output=True, text=True).stdout.strip() == "PONG":
                    break
                time.sleep(0.05)
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
    run = {"wall_ns": wall, "user_ns": 0, "sys_ns": 0, "vcsw": 0, "nivcsw": 0, "idle_entries": None, "idle_source": "none",
           "idle_entries_per_s": None, "idle_ns": 0, "busy_ns": 0, "steal_ns": 0, "cpus_available": 2, "exit_code": None,
           "items": 2 * requests, "throughput": tput, "maxrss_kib": 0}
    doc = {"kind": "run", "name": f"redis-benchmark -c {clients} -n {requests} -t set,get", "params": {"clients": clients, "requests": requests},
           "runs": [run],
           "summary": {"runs": 1, "wall_ns": summary(wall), "cpu_ns": summary(0.0), "user_ns": summary(0.0), "sys_ns": summary(0.0),
                       "vcsw": summary(0.0), "nivcsw": summary(0.0), "steal_ns": summary(0.0)},
           "host": {"kernel": "", "cpus": 2, "allowed_cpus": "0-1", "virtualized": True, "hypervisor": None,
                    "cpuidle_driver": None, "cpuidle_governor": None, "git_revision": None, "date": ""}}
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
