#!/usr/bin/env bash
# Builds the Debian package of gleaner and prints the path of the .deb as the last line of its
# standard output (progress goes to standard error). See docs/packaging.md.
#
#   scripts/build-deb.sh              build the release binary, then package it
#   scripts/build-deb.sh --no-build   package the release binary already built (by
#                                     `cargo build --release` or `cargo test --release`)
#
# Needs cargo-deb (`cargo install cargo-deb --version 3.8.0 --locked`), and dpkg-dev and
# binutils from Debian (dpkg-shlibdeps computes Depends, strip removes the debug info that
# [profile.release] keeps). Generates into target/deb-assets/ (not checked in), from the binary
# itself: the man pages (`gleaner man-pages`), the bash, zsh and fish completions (`gleaner
# completions`) and /etc/gleaner/gleaner.toml (`gleaner daemon --print-config`). The unit is
# dist/gleaner.service. The .deb goes to target/debian/.
set -euo pipefail
cd "$(dirname "$0")/.."

build=1
case "${1:-}" in
  "") ;;
  --no-build) build=0 ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "build-deb.sh: invalid option '$1': allowed: --no-build, --help" >&2
    exit 2
    ;;
esac

if ! cargo deb --version >/dev/null 2>&1; then
  echo "build-deb.sh: cargo-deb is missing: install it with 'cargo install cargo-deb --version 3.8.0 --locked'" >&2
  exit 1
fi

# The target dir as cargo (and so cargo-deb) sees it: CARGO_TARGET_DIR, a config's target-dir, or ./target.
target_dir=$(cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="$target_dir/release/gleaner"
if [ "$build" = 1 ]; then
  cargo build --release --bin gleaner >&2
fi
if [ ! -x "$bin" ]; then
  echo "build-deb.sh: $bin not found: run 'cargo build --release' first, or drop --no-build" >&2
  exit 1
fi

assets=target/deb-assets
rm -rf "$assets"
mkdir -p "$assets/man" "$assets/completions"
"$bin" man-pages "$assets/man" >/dev/null
"$bin" completions bash >"$assets/completions/gleaner.bash"
"$bin" completions zsh >"$assets/completions/_gleaner"
"$bin" completions fish >"$assets/completions/gleaner.fish"
"$bin" daemon --print-config >"$assets/gleaner.toml"
echo "build-deb.sh: generated $(ls "$assets/man" | wc -l) man pages, 3 completion scripts and the sample config into $assets" >&2

# --strip: [profile.release] keeps line tables (debug = 1), which cargo-deb would otherwise ship.
out=$(cargo deb --no-build --strip --output target/debian/)
deb=$(printf '%s\n' "$out" | tail -n 1)
if [ ! -f "$deb" ]; then
  echo "build-deb.sh: cargo deb did not report a .deb (its output: $out)" >&2
  exit 1
fi
echo "$deb"
