#!/usr/bin/env python3
"""Prints the machine a benchmark series runs on, as the machine.json beside its documents
(scripts/bench/readme-tables.py prints it above the table): CPU model, vCPUs, kernel, cpuidle
driver/governor, git revision, date, rounds and the command that made the series.

    machine-json.py ROUNDS COMMAND > OUT/machine.json"""

import datetime
import json
import os
import platform
import subprocess
import sys


def read(path, default="none"):
    try:
        return open(path).read().strip()
    except OSError:
        return default


def main():
    if len(sys.argv) != 3 or not sys.argv[1].isdigit():
        sys.exit("usage: machine-json.py ROUNDS COMMAND")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
    idle = "/sys/devices/system/cpu/cpuidle"
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        git = "unknown"
    print(json.dumps({
        "cpu": cpu,
        "vcpus": os.cpu_count(),
        "kernel": platform.release(),
        "cpuidle": f"{read(idle + '/current_driver')}/{read(idle + '/current_governor')}",
        "git": git,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "rounds": int(sys.argv[1]),
        "command": sys.argv[2],
    }))


if __name__ == "__main__":
    main()
