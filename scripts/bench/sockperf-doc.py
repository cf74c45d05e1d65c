#!/usr/bin/env python3
"""Runs sockperf on loopback (server on CPU 1, client on CPU 0) and prints its result as the
document `gleaner bench` writes (BenchDoc, one run whose `latency` is sockperf's), so that
`gleaner compare` reads it as it reads the built-in latency kernels':

    gleaner compare --policies stock,haltpoll,naive,gleaner -- scripts/bench/sockperf-doc.py pp 3
    gleaner compare ... -- scripts/bench/sockperf-doc.py ul 3 2000     # under-load, 2000 msg/s

Modes: pp (ping-pong: mean one-way latency, sockperf's --mps max) and ul (under-load at a fixed
rate, --reply-every 1). Latencies are sockperf's own (one-way, us); percentiles from its
summary. A benchmark harness: it reads sockperf's text output, not part of gleaner."""

import re
import subprocess
import sys
import time

from benchdoc import print_doc


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "pp"
    secs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    mps = sys.argv[3] if len(sys.argv) > 3 else "2000"
    port = "11111"
    server = subprocess.Popen(["taskset", "-c", "1", "sockperf", "server", "-i", "127.0.0.1", "-p", port],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        if server.poll() is not None:
            sys.exit(f"sockperf server exited at once (status {server.returncode}): taskset -c 1 sockperf server ...")
        if mode == "pp":
            args = ["sockperf", "pp", "-i", "127.0.0.1", "-p", port, "-t", str(secs)]
        elif mode == "ul":
            args = ["sockperf", "ul", "-i", "127.0.0.1", "-p", port, "-t", str(secs), "--mps", mps, "--reply-every", "1"]
        else:
            sys.exit(f"mode {mode!r}: allowed pp, ul")
        t0 = time.monotonic_ns()
        out = subprocess.run(["taskset", "-c", "0"] + args, capture_output=True, text=True, check=True).stdout
        wall = time.monotonic_ns() - t0
    finally:
        server.terminate()
        server.wait()
    text = re.sub(r"\x1b\[[0-9;]*m", "", out)
    m = re.search(r"avg-latency=([0-9.]+)", text)
    if m is None:
        sys.exit(f"sockperf printed no avg-latency: {text.strip()[-300:]!r}")
    avg = float(m.group(1))
    pct = {float(p): float(v) for p, v in re.findall(r"percentile\s+([0-9.]+)\s*=\s*([0-9.]+)", text)}
    samples = int(re.search(r"\[Valid Duration\].*?=\s*(\d+)", text, re.S).group(1)) if re.search(r"\[Valid Duration\].*?=\s*(\d+)", text, re.S) else 0
    m = re.search(r"Total (\d+) observations", text)
    samples = int(m.group(1)) if m else samples
    us = lambda q: pct.get(q, avg) * 1000.0
    obs = lambda name: float(re.search(r"<%s> observation\s*=\s*([0-9.]+)" % name, text).group(1)) * 1000.0
    latency = {"samples": samples, "mean_ns": avg * 1000.0, "min_ns": int(obs("MIN")),
               "p50_ns": us(50.0), "p90_ns": us(90.0), "p99_ns": us(99.0), "p999_ns": us(99.9), "max_ns": int(obs("MAX"))}
    print_doc("sockperf " + " ".join(args[1:]), {"command": args}, wall, samples, samples * 1e9 / wall if wall else None, latency)


if __name__ == "__main__":
    main()
