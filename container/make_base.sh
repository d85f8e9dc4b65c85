#!/bin/sh
# A Debian bookworm base image for container/Containerfile, made without an image registry:
# debootstrap from a Debian mirror, imported into podman as localhost/omnivoice-base:bookworm
# (what tests/test_container.py builds on). Needs root, debootstrap and podman.
#
#   sudo container/make_base.sh [MIRROR]
set -eu
mirror=${1:-http://deb.debian.org/debian}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv bookworm "$root" "$mirror"
tar -C "$root" -c . | podman import - localhost/omnivoice-base:bookworm
