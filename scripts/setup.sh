#!/usr/bin/env bash
# Installs what uraid needs to build, test and benchmark on a fresh Debian machine, then builds.
# Idempotent; run as root (or with sudo available).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

need_pkgs=()
have() { dpkg -s "$1" >/dev/null 2>&1; }
# libisal-dev: parity kernels. fio: raw-device baselines. util-linux: losetup for tests.
# libnbd-bin (nbdinfo, nbdcopy, nbdfuse), nbdkit, qemu-utils (qemu-img, qemu-io, qemu-nbd),
# fuse3 (fusermount3), e2fsprogs (mkfs.ext4, e2fsck): NBD clients, peers and the ext4 test.
# python3, python3-matplotlib: the benchmark suite (scripts/pts.py) and its plots.
# curl, prometheus (promtool): the control-socket tests (curl --unix-socket, promtool check metrics).
# systemd (systemd-analyze): the test that verifies contrib/systemd/uraid@.service.
# man-db (man): the package test renders the generated man pages.
# libssl-dev: TLS with pre-shared keys (OpenSSL). gnutls-bin (certtool, psktool): the TLS tests make
# their certificates and key files with the tools the NBD clients' documentation names.
# libcap2-bin (setcap): the test of `serve` started with a file capability (AT_SECURE).
# zfs-fuse (pulls libfuse2, beside fuse3): the suite's ZFS RAIDZ2 target; pts.py starts and stops its own
# daemon (on a systemd machine the package also enables zfs-fuse.service; pts.py then uses that one).
for p in libisal-dev fio util-linux mount libnbd-bin nbdkit qemu-utils fuse3 e2fsprogs pkg-config \
  python3 python3-matplotlib curl zfs-fuse systemd man-db libssl-dev gnutls-bin libcap2-bin; do
  have "$p" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing ${need_pkgs[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# Ceph (mon, mgr, osd; Debian's 16.2, no recommends): the scale-out test runs a bluestore OSD on a
# uraid volume (docs/scale-out.md, crates/cli/tests/ceph.rs).
./scripts/ceph-osd.sh install >/dev/null

# promtool without the Prometheus server's recommended extras.
if ! command -v promtool >/dev/null 2>&1; then
  echo "setup: installing prometheus (for promtool)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install a stable Rust toolchain (rustup) first" >&2
  exit 1
fi
# cargo-fuzz (crates.io): the fuzz targets run on stable with the sanitizer off (scripts/fuzz.sh).
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "setup: installing cargo-fuzz"
  cargo install cargo-fuzz --locked --quiet
fi
cargo build --release --workspace --quiet
echo "setup: done; binary at target/release/uraid"
