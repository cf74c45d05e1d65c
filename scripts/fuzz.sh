#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ on the stable toolchain and runs them.
#
#   scripts/fuzz.sh --smoke                 every target for SMOKE_SECONDS (default 10) each (CI)
#   scripts/fuzz.sh --seconds N [TARGET...] the given targets (default: all) for N seconds each
#   scripts/fuzz.sh --replay TARGET FILE... run FILEs through TARGET once (a crash, a seed)
#   scripts/fuzz.sh --build                 only build
#   scripts/fuzz.sh --list                  the target names
#
# Seeds are read from fuzz/corpus/TARGET (checked in, never written); new corpus entries go to
# a temp dir removed at the end (FUZZ_KEEP_CORPUS=DIR keeps them in DIR/TARGET instead).
# Crash inputs go to fuzz/artifacts/TARGET/ (ignored by git). Prints, per target, the runs
# and executions per second of libFuzzer's final stats; exits 1 naming every target that
# crashed and its crash file. See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

mode=""
seconds=""
targets=()
files=()
case "${1:-}" in
  --smoke) mode=run; seconds="${SMOKE_SECONDS:-10}"; shift ;;
  --seconds)
    mode=run
    seconds="${2:-}"
    [[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --seconds needs a whole number >= 1, got '${2:-}'" >&2; exit 2; }
    shift 2
    targets=("$@")
    ;;
  --replay)
    mode=replay
    [ $# -ge 3 ] || { echo "fuzz.sh: --replay TARGET FILE..." >&2; exit 2; }
    targets=("$2")
    shift 2
    files=("$@")
    ;;
  --build) mode=build ;;
  --list) mode=list ;;
  *) usage ;;
esac

all=()
for f in fuzz/fuzz_targets/*.rs; do
  all+=("$(basename "$f" .rs)")
done
if [ "$mode" = list ]; then
  printf '%s\n' "${all[@]}"
  exit 0
fi
if [ ${#targets[@]} -eq 0 ]; then
  targets=("${all[@]}")
fi
for t in "${targets[@]}"; do
  if [ ! -f "fuzz/fuzz_targets/$t.rs" ]; then
    echo "fuzz.sh: no target '$t'; targets: ${all[*]}" >&2
    exit 2
  fi
done

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi

# The coverage instrumentation cargo-fuzz uses (SanitizerCoverage: 8-bit counters, PC table,
# comparison tracing, stack depth), all stable rustc flags; no sanitizer (-Zsanitizer is
# nightly-only and the parsers are safe Rust). Debug assertions make integer overflow panic.
# An explicit --target keeps these flags away from build scripts and proc macros.
triple=$(rustc -vV | sed -n 's/^host: //p')
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-simplifycfg-branch-fold-threshold=0"
flags+=" -Cllvm-args=-sanitizer-coverage-stack-depth --cfg fuzzing -Cdebug-assertions"
export RUSTFLAGS="$flags${RUSTFLAGS:+ $RUSTFLAGS}"
build_start=$(date +%s)
echo "== fuzz: building ${#targets[@]} target(s) ($(rustc --version), $triple)"
bin_args=()
for t in "${targets[@]}"; do
  bin_args+=(--bin "$t")
done
cargo build --release --manifest-path fuzz/Cargo.toml --target "$triple" "${bin_args[@]}"
echo "== fuzz: build took $(($(date +%s) - build_start)) s"
[ "$mode" = build ] && exit 0
bindir="$root/fuzz/target/$triple/release"

if [ "$mode" = replay ]; then
  exec "$bindir/${targets[0]}" -runs=1 "${files[@]}"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/gleaner-fuzz.XXXXXX")
# Fixture targets write a small tree per input: on tmpfs that is ~10x faster than on disk.
fixtures=$(mktemp -d /dev/shm/gleaner-fuzz.XXXXXX 2>/dev/null || mktemp -d "$work/fixtures.XXXXXX")
trap 'rm -rf "$work" "$fixtures"' EXIT
failed=()
printf '%-18s %12s %12s %8s  %s\n' target runs "execs/s" corpus result
for t in "${targets[@]}"; do
  seeds="$root/fuzz/corpus/$t"
  new="${FUZZ_KEEP_CORPUS:+$FUZZ_KEEP_CORPUS/$t}"
  new="${new:-$work/corpus/$t}"
  art="$root/fuzz/artifacts/$t"
  mkdir -p "$new" "$art"
  log="$work/$t.log"
  rc=0
  # -timeout: one input taking longer is a hang (a crash); -rss_limit_mb: a tiny input must
  # not allocate gigabytes.
  TMPDIR="$fixtures" "$bindir/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -dict="$root/fuzz/numbers.dict" -print_final_stats=1 -artifact_prefix="$art/" "$new" "$seeds" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  units=$(find "$new" -type f | wc -l)
  if [ "$rc" -eq 0 ]; then
    result=ok
  else
    crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    result="CRASH (exit $rc): ${crash:-no crash file; see the log below}"
    failed+=("$t: ${crash:-exit $rc}")
  fi
  printf '%-18s %12s %12s %8s  %s\n' "$t" "${runs:-?}" "${eps:-?}" "$units" "$result"
  if [ "$rc" -ne 0 ]; then
    echo "---- $t: last lines of libFuzzer's output"
    tail -40 "$log" | sed 's/^/    /'
    echo "---- replay: scripts/fuzz.sh --replay $t ${crash:-FILE}"
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) crashed:" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} target(s), ${seconds} s each, no crash"
