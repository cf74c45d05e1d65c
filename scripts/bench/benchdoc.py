"""The document `gleaner bench` writes (BenchDoc, one run), for the harnesses of this folder
that wrap a real program (sockperf, redis-benchmark, wrk) so `gleaner compare` reads its
result as it reads the built-in kernels'. Fields a harness cannot know (CPU times, switches)
are 0; `gleaner compare` measures those itself around the command."""

import json


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
