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

import os
import subprocess
import sys
import tempfile

from benchdoc import conns_and_secs, print_kv_latency, print_wrk_doc, run_wrk, wait_for_url

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
        server = subprocess.Popen(["nginx", "-p", d, "-c", f"{d}/nginx.conf", "-e", f"{d}/error.log"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            url = f"http://127.0.0.1:{port}/index.html"
            wait_for_url(url, server, "nginx")
            if kv:
                print_kv_latency("http", port, secs)
                return
            doc = run_wrk(conns, secs, url, d, cpu=0)
        finally:
            server.terminate()
            server.wait()
    print_wrk_doc("nginx", conns, secs, doc)


if __name__ == "__main__":
    main()
