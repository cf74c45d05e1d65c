#!/usr/bin/env python3
"""Starts a private nginx (one worker, on CPU 1, loopback, a 612-byte static page) and loads
it with wrk on CPU 0, printing the result as the document `gleaner bench` writes (BenchDoc,
one run), for `gleaner compare`:

    gleaner compare --policies stock,haltpoll,naive,gleaner -- scripts/bench/nginx-doc.py 1 3     # 1 connection: latency
    gleaner compare ... -- scripts/bench/nginx-doc.py 50 3                                         # 50 connections: throughput

Arguments: connections (wrk -c, default 1), seconds (default 3). With one connection wrk is a
closed loop of one client, whose request latency (wrk's own, from a Lua `done` hook: mean and
percentiles) is the result; with more, the requests a second. `lat SECONDS`: the client is
`kv-latency.c http` (this folder) instead of wrk, a closed loop of one keep-alive connection
whose requests `KV_LATENCY_DUMP=FILE` writes one by one, as for redis and memcached. A benchmark harness: it reads
wrk's output, not part of gleaner. Needs the Debian packages nginx and wrk."""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchdoc import conns_and_secs, print_doc, print_kv_latency

CONF = """worker_processes 1;
worker_cpu_affinity 10;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  {keepalive}
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  server {{ listen 127.0.0.1:{port}; root {d}/www; }}
}}
"""

DONE = """done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"requests": %d, "duration_us": %d, "errors": %d, "mean_us": %f, "min_us": %d, "max_us": %d, '
    .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "p999_us": %d}\\n', summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout, latency.mean, latency.min, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9)))
end
"""


def main():
    kv = len(sys.argv) > 1 and sys.argv[1] == "lat"
    conns, secs = conns_and_secs(["", "1"] + sys.argv[2:] if kv else sys.argv)
    port = 18080 + os.getpid() % 1000
    with tempfile.TemporaryDirectory(prefix="gleaner-nginx-") as d:
        os.chmod(d, 0o755)  # the worker runs as nobody
        os.mkdir(f"{d}/www")
        with open(f"{d}/www/index.html", "w") as f:
            f.write("<html><body>" + "gleaner " * 75 + "</body></html>\n")
        with open(f"{d}/nginx.conf", "w") as f:
            # kv-latency keeps its one connection (nginx closes one after 1,000 requests by
            # default; wrk reconnects, as before).
            f.write(CONF.format(d=d, port=port, keepalive="keepalive_requests 1000000000;" if kv else ""))
        with open(f"{d}/done.lua", "w") as f:
            f.write(DONE)
        server = subprocess.Popen(["nginx", "-p", d, "-c", f"{d}/nginx.conf", "-e", f"{d}/error.log"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            url = f"http://127.0.0.1:{port}/index.html"
            for _ in range(100):
                if server.poll() is not None:
                    sys.exit(f"nginx exited at once (status {server.returncode}): {server.stderr.read().decode().strip()[-300:]}")
                try:
                    urllib.request.urlopen(url, timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.05)
            if kv:
                print_kv_latency("http", port, secs)
                return
            threads = "1" if conns == 1 else "2"
            t0 = time.monotonic_ns()
            out = subprocess.run(["taskset", "-c", "0", "wrk", "-t", threads, "-c", str(conns), "-d", f"{secs}s", "-s", f"{d}/done.lua", url],
                                 capture_output=True, text=True, check=True).stdout
            wall = time.monotonic_ns() - t0
        finally:
            server.terminate()
            server.wait()
    line = next((l for l in out.splitlines() if l.startswith("{")), None)
    if line is None:
        sys.exit(f"wrk printed no summary: {out.strip()[-300:]!r}")
    r = json.loads(line)
    if r["errors"]:
        sys.exit(f"wrk saw {r['errors']} errors of {r['requests']} requests")
    n = r["requests"]
    tput = n * 1e6 / r["duration_us"]
    latency = None
    if conns == 1:
        latency = {"samples": n, "mean_ns": r["mean_us"] * 1000.0, "min_ns": r["min_us"] * 1000, "p50_ns": r["p50_us"] * 1000.0,
                   "p90_ns": r["p90_us"] * 1000.0, "p99_ns": r["p99_us"] * 1000.0, "p999_ns": r["p999_us"] * 1000.0,
                   "max_ns": r["max_us"] * 1000}
    print_doc(f"nginx + wrk -c {conns} -d {secs}s", {"connections": conns, "seconds": secs}, wall, n, tput, latency)


if __name__ == "__main__":
    main()
