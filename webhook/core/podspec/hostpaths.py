"""The host-path guard: hostPath volumes that expose the node's GPU devices, the driver or the limit layer.

Memoised by the path (pods of one workload mount the same few), since the webhook's fast path asks it of
every volume of every pod in a managed namespace.
"""

from __future__ import annotations

import posixpath
from functools import lru_cache

# Host paths that hold GPU device nodes, the driver or the limit layer's files. A name ending in "*"
# matches every name that starts with it in that directory (/dev/nvidia0, /dev/nvidia-caps, ...).
GPU_HOST_PATHS: tuple[str, ...] = (
    "/dev/nvidia*",  # NVIDIA device nodes: nvidia0.., nvidiactl, nvidia-uvm, nvidia-caps, nvidia-nvswitch..
    "/dev/char",  # symlinks to every character device by major:minor, the GPUs' included
    "/dev/dri",  # DRM nodes: nvidia-drm's, and Hygon DCUs (ROCm) with /dev/kfd
    "/dev/kfd",
    "/dev/mkfd",
    "/dev/cambricon*",  # Cambricon MLU nodes: cambricon_dev0.., cambricon_ctl, cambricon-caps
    "/run/nvidia*",  # GPU operator's driver root (/run/nvidia/driver), persistenced, fabric manager
    "/var/run/nvidia*",
    "/usr/local/vgpu",  # HAMi-core: libvgpu.so, ld.so.preload, the per-container accounting files
    "/tmp/vgpulock",  # HAMi-core's lock directory
)


def normal_host_path(path: str) -> str:
    """The path the kubelet mounts: `//dev`, `/dev/../dev/` and `/dev/.` are all `/dev`. posixpath keeps
    a leading `//` (POSIX leaves it implementation-defined; Linux treats it as `/`), so collapse it."""
    return posixpath.normpath("/" + path.lstrip("/"))


def _exposes(normal: str, guarded: str) -> bool:
    if guarded.endswith("*"):
        base = guarded[:-1]
        parent = base.rpartition("/")[0] or "/"
        if normal.startswith(base):
            return True
        return normal == parent or parent.startswith(normal.rstrip("/") + "/")
    return normal == guarded or normal.startswith(guarded + "/") or guarded.startswith(normal.rstrip("/") + "/")


def is_device_hostpath(path: object) -> bool:
    """A hostPath that is, holds, or lies inside a path of GPU_HOST_PATHS (so `/`, `/dev`, `/run` too),
    compared after normalising. Ordinary data directories (/data, /mnt/datasets, /var/log) are not."""
    return isinstance(path, str) and bool(path) and _exposes_gpu(path)


@lru_cache(maxsize=1024)
def _exposes_gpu(path: str) -> bool:
    normal = normal_host_path(path)
    return any(_exposes(normal, guarded) for guarded in GPU_HOST_PATHS)
