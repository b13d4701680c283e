#!/usr/bin/env bash
# Build talkgate's container image (deploy/Containerfile) with buildah, on a Debian base root filesystem that
# mmdebstrap makes from Debian's packages: nothing is pulled but Debian's and PyPI's packages.
#   scripts/image.sh                  the CPU image, localhost/talkgate:cpu (what `make image` runs)
#   VARIANT=cuda scripts/image.sh     the CUDA image, localhost/talkgate:cuda (torch's CUDA wheels from PyPI)
# Environment: IMAGE (the tag), WARMUP_MODEL (deploy/Containerfile), STORAGE_DRIVER (default vfs: works
# where overlay mounts do not, e.g. inside a container), BUILDAH_ISOLATION (default chroot: no user namespaces).
# The base tarball is kept in .image/ (git-ignored): delete it to take Debian's latest packages into the base
# (the image build also upgrades them).
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${VARIANT:-cpu}
suite=bookworm                                  # Python 3.11, the version talkgate is tested with
image=${IMAGE:-localhost/talkgate:$variant}
base=localhost/talkgate-base:$suite
tarball=.image/debian-$suite-minbase.tar
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v buildah >/dev/null || ! command -v mmdebstrap >/dev/null; then
  echo "image: installing buildah and mmdebstrap with apt-get"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq buildah mmdebstrap >/dev/null
fi

start=$(date +%s)
if [ ! -f "$tarball" ]; then
  mkdir -p .image
  # minbase: dpkg, apt and the essential packages; the security suite so that the image's upgrade finds fixes
  as_root mmdebstrap --quiet --variant=minbase --format=tar "$suite" "$tarball.partial" \
    "deb http://deb.debian.org/debian $suite main" \
    "deb http://deb.debian.org/debian $suite-updates main" \
    "deb http://deb.debian.org/debian-security $suite-security main"
  mv "$tarball.partial" "$tarball"
fi
# imported again when the tarball is newer (committing to the tag moves it off an image made from an older one)
if ! buildah inspect --type image "$base" >/dev/null 2>&1 || [ "$tarball" -nt .image/base-imported ]; then
  c=$(buildah from scratch)
  buildah add --quiet "$c" "$tarball" / >/dev/null
  buildah commit --quiet --rm "$c" "$base" >/dev/null
  touch .image/base-imported
fi
echo "image: base $base from $tarball ready after $(( $(date +%s) - start )) s"

args=(--build-arg "BASE=$base" --build-arg "WARMUP_MODEL=${WARMUP_MODEL:-}")
[ "$variant" = cuda ] && args+=(--build-arg "TORCH=torch==2.13.0" --build-arg "TORCH_INDEX=")
# Where pip's wheels come from a local folder (on this project's machines the CPU torch wheel lies there and
# download.pytorch.org is out of reach), the build uses that folder in place of torch's index.
if [ "$variant" = cpu ] && [ -d "${PIP_FIND_LINKS:-}" ] && compgen -G "$PIP_FIND_LINKS/torch-*+cpu-*.whl" >/dev/null; then
  args+=(--volume "$(realpath "$PIP_FIND_LINKS"):/wheels:ro" --build-arg WHEELS=/wheels --build-arg "TORCH_INDEX=")
fi
# HTTPS through a proxy of its own CA: pip's CA bundle, mounted for the build's pip (deploy/Containerfile)
pip_cert=${PIP_CERT:-$(pip3 config get global.cert 2>/dev/null || true)}
[ -f "$pip_cert" ] && args+=(--volume "$(realpath "$pip_cert"):/run/pip-ca.pem:ro" --build-arg PIP_CERT=/run/pip-ca.pem)
buildah build --quiet --format docker --file deploy/Containerfile --tag "$image" "${args[@]}" .
buildah rmi --prune >/dev/null 2>&1 || true     # the build stages' images: whole copies of the root under vfs
echo "image: $image built in $(( $(date +%s) - start )) s, $(buildah images --noheading --format '{{.Size}}' "$image")"
