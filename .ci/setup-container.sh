#!/usr/bin/env bash
# Installs what tests/project/test_container.py needs: podman, runc, debootstrap, and a local base image
# `localhost/debian-python:bookworm` made from Debian packages (no registry is needed).
# Idempotent: with everything present it only checks and exits within a second or two.
# GPU_ADMISSION_ENGINE=docker imports the base image into a running Docker instead of podman.
set -euo pipefail

IMAGE="${GPU_ADMISSION_BASE_IMAGE:-localhost/debian-python:bookworm}"
CACHE="${GPU_ADMISSION_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-admission}"
CONF="$CACHE/containers.conf"

ENGINE="${GPU_ADMISSION_ENGINE:-podman}"
tools=(debootstrap)
[[ "$ENGINE" == podman ]] && tools+=(podman runc)
missing=()
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "setup-container: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Sandboxes like CI's forbid raising rlimits and run cgroups in hybrid mode: podman is told not to set
# ulimits here, and the callers pass --cgroup-manager=cgroupfs --runtime runc. Docker needs none of this.
mkdir -p "$CACHE"
if [[ ! -s "$CONF" ]]; then
  printf '[containers]\ndefault_ulimits = []\n' >"$CONF"
fi
export CONTAINERS_CONF="$CONF"

engine=(docker)
[[ "$ENGINE" == podman ]] && engine=(podman --cgroup-manager=cgroupfs)
if "${engine[@]}" image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "setup-container: $IMAGE present"
  exit 0
fi

echo "setup-container: building $IMAGE with debootstrap (about a minute)"
rootfs="$(mktemp -d "${TMPDIR:-/tmp}/gpu-admission-rootfs.XXXXXX")"
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" >"$CACHE/debootstrap.log" 2>&1 \
  || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
# Drop what a runtime image never needs (apt lists, docs) to keep the base small.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/var/cache/apt/*.bin
tar -C "$rootfs" -c . | "${engine[@]}" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' - "$IMAGE" >/dev/null
echo "setup-container: $IMAGE imported"
