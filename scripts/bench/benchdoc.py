"""The document `gleaner bench` writes (BenchDoc, one run), for the harnesses of this folder
that wrap a real program (sockperf, redis-benchmark, wrk) so `gleaner compare` reads its
result as it reads the built-in kernels'. Fields a harness cannot know (CPU times, switches)
are 0; `gleaner compare` measures those itself around the command."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def summary(v):
    return {"n": 1, "mean": v, "min": v, "p10": v, "p50": v, "p90": v, "p99": v, "max": v}


def print_doc(name, params, wall_ns, items, throughput, latency=None):
    """Prints one run's document. `latency`: the run's request latency in ns (keys samples,
    mean_ns, min_ns, p50_ns, p90_ns, p99_ns, p999_ns, max_ns), for a latency workload."""
    run = {"wall_ns": wall_ns, "user_ns": 0, "sys_ns": 0, "vcsw": 0, "nivcsw": 0, "idle_entries": None, "idle_source": "none",
           "idle_entries_per_s": None, "idle_ns": 0, "busy_ns": 0, "steal_ns": 0, "cpus_available": 2, "exit_code": None,
           "items": items, "throughput": throughput, "maxrss_kib": 0}
    if latency is not None:
        run["latency"] = latency
    doc = {"kind": "run", "name": name, "params": params,
           "runs": [run],
           "summary": {"runs": 1, "wall_ns": summary(wall_ns), "cpu_ns": summary(0.0), "user_ns": summary(0.0), "sys_ns": summary(0.0),
                       "vcsw": summary(0.0), "nivcsw": summary(0.0), "steal_ns": summary(0.0)},
           "host": {"kernel": "", "cpus": 2, "allowed_cpus": "0-1", "virtualized": True, "hypervisor": None,
                    "cpuidle_driver": None, "cpuidle_governor": None, "git_revision": None, "date": ""}}
    print(json.dumps(doc))


def conns_and_secs(argv):
    """The harnesses' two arguments: connections (default 1) and seconds (default 3), both at
    least 1, or an exit naming them."""
    conns = int(argv[1]) if len(argv) > 1 else 1
    secs = int(argv[2]) if len(argv) > 2 else 3
    if conns < 1 or secs < 1:
        sys.exit(f"connections {conns}, seconds {secs}: both must be at least 1")
    return conns, secs


def print_kv_latency(proto, port, secs):
    """Runs `kv_latency` against the `proto` server (memcached, redis, http) and prints its
    document: one run of the requests counted, their rate and latency."""
    lat, wall = kv_latency(proto, port, secs)
    n = lat["samples"]
    print_doc(f"{proto} + kv-latency -c 1 -t {secs}s", {"connections": 1, "seconds": secs}, wall, n, n * 1e9 / lat["wall_ns"],
              {k: lat[k] for k in ("samples", "mean_ns", "min_ns", "p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns")})


def kv_latency(proto, port, secs):
    """Runs `kv-latency.c` (compiled once into ~/.cache/gleaner-bench, again when the source
    is newer) on CPU 0 against a server on the loopback `port`: a closed loop of one
    connection for `secs` seconds. Returns (its latency summary, wall ns)."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kv-latency.c")
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gleaner-bench")
    exe = os.path.join(cache, "kv-latency")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        os.makedirs(cache, exist_ok=True)
        cc = subprocess.run(["cc", "-O2", "-o", exe + ".tmp", src], capture_output=True, text=True)
        if cc.returncode != 0:
            sys.exit(f"compiling {src} failed: {cc.stderr.strip()[-300:]}")
        os.replace(exe + ".tmp", exe)
    t0 = time.monotonic_ns()
    p = subprocess.run(["taskset", "-c", "0", exe, proto, "127.0.0.1", str(port), str(secs)], capture_output=True, text=True)
    wall = time.monotonic_ns() - t0
    if p.returncode != 0:
        sys.exit(f"kv-latency {proto} exited {p.returncode}: {p.stderr.strip()[-300:]}")
    return json.loads(p.stdout), wall


def wait_ready(server, name, ready, never, err=None):
    """Calls `ready` (it raises OSError until the server answers) every 50 ms for 5 s at most;
    exits naming `name` if `server` (its Popen) exits first, with the end of its stderr (piped,
    or the file `err`), or if it never answers (`never` says what it never did)."""
    for _ in range(100):
        if server.poll() is not None:
            text = server.stderr.read().decode() if server.stderr else open(err).read() if err else ""
            sys.exit(f"{name} exited at once (status {server.returncode})" + (f": {text.strip()[-300:]}" if text.strip() else ""))
        try:
            ready()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{name} never {never}")


def wait_for_port(port, server, name):
    """Waits until a TCP server listens on the loopback `port` (`wait_ready`)."""
    wait_ready(server, name, lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close(), f"listened on 127.0.0.1:{port}")


def wait_for_url(url, server, name, err=None):
    """Waits until an HTTP server answers `url` (`wait_ready`; `err`: the file its stderr goes
    to, if not piped)."""
    wait_ready(server, name, lambda: urllib.request.urlopen(url, timeout=1).read(), f"answered {url}", err)


# wrk's `done` hook: one JSON line of the run's requests, errors and latency (us).
WRK_DONE = """done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"requests": %d, "duration_us": %d, "errors": %d, "mean_us": %f, "min_us": %d, "max_us": %d, '
    .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "p999_us": %d}\\n', summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout, latency.mean, latency.min, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9)))
end
"""


def run_wrk(conns, secs, url, tmpdir, cpu=None):
    """Loads `url` with wrk (`conns` connections, one thread for one connection, else two) for
    `secs` seconds, on CPU `cpu` if given (else wherever the scheduler puts it). Returns wrk's
    summary (WRK_DONE's keys) with the wall time, `wall_ns`; exits on errors."""
    lua = os.path.join(tmpdir, "done.lua")
    with open(lua, "w") as f:
        f.write(WRK_DONE)
    cmd = ["wrk", "-t", "1" if conns == 1 else "2", "-c", str(conns), "-d", f"{secs}s", "-s", lua, url]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu)] + cmd
    t0 = time.monotonic_ns()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    wall = time.monotonic_ns() - t0
    line = next((l for l in out.splitlines() if l.startswith("{")), None)
    if line is None:
        sys.exit(f"wrk printed no summary: {out.strip()[-300:]!r}")
    r = json.loads(line)
    if r["errors"]:
        sys.exit(f"wrk saw {r['errors']} errors of {r['requests']} requests")
    r["wall_ns"] = wall
    return r


def print_wrk_doc(server, conns, secs, r, latency_up_to=1):
    """Prints the document of a wrk run (`run_wrk`'s result) against `server`: the requests a
    second, and the request latency where at most `latency_up_to` connections made it a closed
    loop whose latency is the result."""
    n = r["requests"]
    latency = None
    if conns <= latency_up_to:
        latency = {"samples": n, "mean_ns": r["mean_us"] * 1000.0, "min_ns": r["min_us"] * 1000, "p50_ns": r["p50_us"] * 1000.0,
                   "p90_ns": r["p90_us"] * 1000.0, "p99_ns": r["p99_us"] * 1000.0, "p999_ns": r["p999_us"] * 1000.0,
                   "max_ns": r["max_us"] * 1000}
    print_doc(f"{server} + wrk -c {conns} -d {secs}s", {"connections": conns, "seconds": secs}, r["wall_ns"], n,
              n * 1e6 / r["duration_us"], latency)
