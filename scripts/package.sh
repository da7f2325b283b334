#!/usr/bin/env bash
# Builds the Debian package: target/debian/uraid_VERSION_ARCH.deb with the binary, the
# systemd unit, man pages and bash/zsh/fish completions generated from the argument
# definitions (`uraid generate-docs`), the example config, the alert rules and the docs.
#   scripts/package.sh              # builds the release binary first
#   URAID_BIN=path URAID_PKG_OUT=dir scripts/package.sh   # that binary, into dir (the tests)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${URAID_BIN:-}" ]; then
  cargo build --release -p uraid
  URAID_BIN=target/release/uraid
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
out=${URAID_PKG_OUT:-target/debian}
root="$out/uraid_${version}_${arch}"
rm -rf "$root" && mkdir -p "$root/DEBIAN"
install -D -m 0755 "$URAID_BIN" "$root/usr/bin/uraid"
strip --strip-debug "$root/usr/bin/uraid" 2>/dev/null || true
install -D -m 0644 contrib/systemd/uraid@.service "$root/lib/systemd/system/uraid@.service"
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
"$URAID_BIN" generate-docs --man "$gen/man" --completions "$gen/comp"
mkdir -p "$root/usr/share/man/man8"
for m in "$gen"/man/*.8; do gzip -9n -c "$m" > "$root/usr/share/man/man8/$(basename "$m").gz"; done
install -D -m 0644 "$gen/comp/uraid.bash" "$root/usr/share/bash-completion/completions/uraid"
install -D -m 0644 "$gen/comp/_uraid" "$root/usr/share/zsh/vendor-completions/_uraid"
install -D -m 0644 "$gen/comp/uraid.fish" "$root/usr/share/fish/vendor_completions.d/uraid.fish"
doc="$root/usr/share/doc/uraid"
install -D -m 0644 contrib/uraid.conf.example "$doc/examples/uraid.conf"
install -D -m 0644 contrib/prometheus/uraid.rules.yml "$doc/examples/prometheus/uraid.rules.yml"
install -D -m 0644 contrib/prometheus/uraid.rules.test.yml "$doc/examples/prometheus/uraid.rules.test.yml"
install -D -m 0644 contrib/grafana/uraid.json "$doc/examples/grafana/uraid.json"
for f in README.md ARCHITECTURE.md docs/format.md docs/control.md docs/invariants.md; do
  install -D -m 0644 "$f" "$doc/$(basename "$f")"
done
cat > "$doc/copyright" <<COPY
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: uraid
Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
COPY
mkdir -p "$root/etc/uraid"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: uraid
Version: $version
Architecture: $arch
Maintainer: uraid developers <uraid@localhost>
Depends: libc6 (>= 2.34), libgcc-s1, libisal2, libssl3
Recommends: nbd-client | libnbd-bin
Section: admin
Priority: optional
Installed-Size: $size
Description: software RAID for NVMe in user space, served over NBD
 uraid assembles NVMe drives (or files) into RAID 0, 1, 10, 5, 6, triple-parity
 and N+M erasure-coded arrays on io_uring, and serves each array as a block
 device over NBD (TCP or Unix sockets) to Linux hosts, qemu and libnbd tools.
 Degraded operation, rebuild onto hot spares, scrub, a write-intent bitmap and
 a journal that closes the write hole; systemd unit uraid@NAME, alert rules.
CONTROL
cat > "$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
POSTINST
chmod 0755 "$root/DEBIAN/postinst"
dpkg-deb --root-owner-group --build "$root" "$out/uraid_${version}_${arch}.deb" >/dev/null
echo "$out/uraid_${version}_${arch}.deb"
