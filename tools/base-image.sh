#!/usr/bin/env bash
# The image's base when no registry is reachable: a minimal Debian bookworm root file system made with
# debootstrap from a Debian mirror, with Python 3.11 (and venv, distutils) and the CA certificates, imported as
# a Docker image. Nothing is pulled from a registry. Usage (root, or sudo for debootstrap):
#   tools/base-image.sh TAG [MIRROR]      e.g. tools/base-image.sh local/debian-python:3.11-bookworm
# MIRROR defaults to the Debian mirror apt uses on this machine, else http://deb.debian.org/debian.
set -euo pipefail
tag=${1:?usage: tools/base-image.sh TAG [MIRROR]}
mirror=${2:-$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
               sed -n 's|^URIs: *\(http[^ ]*/debian\)/*$|\1|p; s|^deb \(http[^ ]*/debian\)/* bookworm .*|\1|p' |
               sed -n 1p || true)}
mirror=${mirror:-http://deb.debian.org/debian}
command -v debootstrap >/dev/null || {
  echo "debootstrap not found: install it (apt-get install -y debootstrap)" >&2; exit 1; }
sudo=$([ "$(id -u)" = 0 ] || echo sudo)
rootfs=$(mktemp -d "${TMPDIR:-/tmp}/mtlflow-rootfs.XXXXXX")
trap '$sudo rm -rf "$rootfs"' EXIT
echo "debootstrap bookworm from $mirror into $rootfs"
$sudo debootstrap --variant=minbase \
  --include=python3.11,python3.11-venv,python3-distutils,ca-certificates \
  bookworm "$rootfs" "$mirror" > "$rootfs.log" 2>&1 || {
  echo "debootstrap failed; its log is $rootfs.log" >&2; exit 1; }
# The downloaded .debs and apt lists are not part of a runtime base.
$sudo rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/*
$sudo tar -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "debootstrap --variant=minbase bookworm from $mirror" - "$tag" > /dev/null
rm -f "$rootfs.log"
echo "base image $tag: $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
