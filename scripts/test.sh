#!/usr/bin/env bash
# The whole test suite on a fresh Debian or Ubuntu machine: installs what the tests need, then
# runs them all. It needs root (the tests are real privileged tests: cgroups, idle knobs,
# scheduler syscalls, eBPF, QEMU guests); run by another user it runs itself again under sudo,
# keeping PATH and the Rust toolchain's homes:
#
#   scripts/test.sh                  # install, fetch the lab kernel, restore, test
#   scripts/test.sh --install-only   # only the packages and cargo-deb (.ci/run)
#   scripts/test.sh --skip-install   # the rest, prerequisites already there (.ci/run)
#
# This is the one list of what the tests need; .ci/run calls this script. With the
# prerequisites installed, the inner step alone is `cargo test --workspace --release
# --no-fail-fast` (as root). Everything comes from Debian's packages or crates.io.
set -euo pipefail
cd "$(dirname "$0")/.."

install=1
test=1
for a in "$@"; do
  case "$a" in
    --install-only) test=0 ;;
    --skip-install) install=0 ;;
    *) echo "scripts/test.sh: unknown argument '$a': allowed: --install-only, --skip-install" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    exec sudo env "PATH=$PATH" "CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}" "RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}" bash "$0" "$@"
  fi
  echo "scripts/test.sh: needs root (apt-get install, then tests that create cgroups, turn idle knobs and trace with eBPF), and there is no sudo: run it as root" >&2
  exit 2
fi

# Debian packages, and what needs each.
packages=(
  sysbench stress-ng          # real workloads of `bench run` and the agent tests
  qemu-system-x86             # lab guests (TCG, or KVM where the host can)
  busybox-static cpio         # the guests' initramfs: init and tools, and its archive
  xz-utils gzip zstd          # kernel and module compressions (vmlinux out of vmlinuz)
  dpkg apt                    # apt-get download + dpkg-deb -x: the lab kernel, never installed
  kmod                        # modprobe: the cpuidle-haltpoll driver
  fonts-dejavu-core           # text in PNG plots
  util-linux                  # setpriv (unprivileged-agent and security tests), mount/umount
  mount                       # the full-/run fault test
  python3                     # the thread-churning workload of tests/faults.rs, socket probes
  python3-prometheus-client   # the OpenMetrics parser that reads the agent's Prometheus text in its unit tests
  ca-certificates             # crates.io over TLS (cargo install cargo-deb)
  dpkg-dev binutils           # the Debian package: dpkg-shlibdeps, strip, readelf
  systemd man-db              # systemd-analyze verify of the unit, man -l on the man pages
  g++                         # the fuzz targets' libFuzzer (scripts/fuzz.sh)
  git                         # provenance (git revision) of benchmark documents
)
CARGO_DEB_VERSION=3.8.0

# `sudo` drops the invoking user's PATH: find their rustup toolchain if root has none.
if ! command -v cargo >/dev/null 2>&1; then
  for home in "${HOME:-/root}" "$(getent passwd "${SUDO_USER:-}" 2>/dev/null | cut -d: -f6)"; do
    if [ -n "$home" ] && [ -x "$home/.cargo/bin/cargo" ]; then
      export PATH="$home/.cargo/bin:$PATH"
      [ -d "$home/.rustup" ] && export RUSTUP_HOME="${RUSTUP_HOME:-$home/.rustup}"
      break
    fi
  done
fi
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if ! command -v cargo >/dev/null 2>&1; then
  echo "scripts/test.sh: needs Rust's cargo (rustup: https://rustup.rs), on root's PATH or in ~/.cargo/bin of the user running sudo" >&2
  exit 2
fi

if [ "$install" = 1 ]; then
  echo "== installing test prerequisites (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
  echo "== cargo-deb $CARGO_DEB_VERSION (crates.io), for the package tests"
  if [ "$(cargo deb --version 2>/dev/null)" != "cargo-deb $CARGO_DEB_VERSION" ]; then
    cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked
  fi
  echo "== the guest kernel the lab tests fetch (apt-cache policy linux-image-amd64)"
  apt-cache policy linux-image-amd64 | sed -n '1,3p'
fi

if [ "$test" = 1 ]; then
  echo "== guest kernel for the QEMU tests (apt-get download into the lab cache, never installed)"
  cargo build --release
  ./target/release/gleaner lab fetch-kernel

  echo "== what agents killed before this run left (gleaner restore: their journals in /run/gleaner)"
  # An agent and its guardian both killed with SIGKILL leave their journal: its cpuset cgroup
  # and idle knobs stay changed, and the tests that check for leftovers would blame themselves.
  ./target/release/gleaner restore || echo "gleaner restore failed: the tests below may see its leftovers"
  # A benchmark series killed outright leaves its record of the idle knobs it had turned
  # (scripts/bench/front.py, /run/gleaner-front): put back from it, or say there was none.
  python3 scripts/bench/front.py --restore || echo "front.py --restore failed: the idle tests below may see its knobs"

  # A killed program's poll-only resume latency or disabled idle state makes every idle
  # measurement below poll; the tests that depend on it fail naming the file, and this says so
  # before they run (the suite changes none of them).
  for f in /sys/devices/system/cpu/cpu[0-9]*/power/pm_qos_resume_latency_us; do
    [ "$(cat "$f" 2>/dev/null)" = "n/a" ] && echo "warning: $f is n/a (every idle period polls; the kernel boots with 0): idle tests will fail"
  done
  for f in /sys/devices/system/cpu/cpu[0-9]*/cpuidle/state*/disable; do
    [ "$(cat "$f" 2>/dev/null)" = "0" ] || [ ! -e "$f" ] || echo "warning: $f is $(cat "$f") (the kernel boots with 0): idle tests will fail"
  done

  echo "== test suite"
  # --no-fail-fast: every test binary runs and every failure is listed.
  cargo test --workspace --release --no-fail-fast
fi
