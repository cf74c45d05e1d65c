#!/usr/bin/env bash
# Debian packages the `gleaner lab` tests and commands need (idempotent; run by .ci/run as root
# after `apt-get update`). The guest kernel itself is NOT installed: the lab tests fetch it into
# the lab cache with `apt-get download` + `dpkg-deb -x` through the same code path as
# `gleaner lab fetch-kernel`.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(
  qemu-system-x86     # the guests (TCG, or KVM where the host can)
  busybox-static      # the guest initramfs' init and tools
  xz-utils            # extracting vmlinux from Debian's xz-compressed vmlinuz (faster boot)
  gzip zstd           # other kernel/module compressions
  dpkg apt            # apt-get download, dpkg-deb -x
  fonts-dejavu-core   # text in the report's PNG plots
)
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "lab-deps: all present: ${pkgs[*]}"
else
  echo "lab-deps: installing ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "lab-deps: apt-cache policy linux-image-amd64 (the guest kernel the tests will fetch):"
apt-cache policy linux-image-amd64 | sed -n '1,3p'
