"""What each enforcement backend reads inside the container, as environment variables.

hami-core (libvgpu.so) reads CUDA_DEVICE_MEMORY_LIMIT_<i> and CUDA_DEVICE_SM_LIMIT; the CUDA MPS
client reads CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache

BACKEND_PREFIXES = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
_MEMORY_VAR = re.compile(r"^CUDA_DEVICE_MEMORY_LIMIT(_\d+)?$")


@lru_cache(maxsize=512)
def limit_env(backend: str, gpus: int, memory_mib: int, cores: int) -> tuple[tuple[str, str], ...]:
    """The (name, value) pairs a container with `gpus` devices of `memory_mib` and `cores` % each gets.
    Memoised: every admission asks, and a cluster has few distinct slices.

    `memory_mib` 0 is a card whose size no Node states (a GPU product label without nvidia.com/gpu.memory,
    and no GPUInventory): no memory variable then, which is what the container gets anyway. HAMi-core
    logs `0m` as an invalid limit and runs without one (multiprocess_memory_limit.c), so writing it only
    told readers of the pod "0 MiB"; an MPS pin of 0 MiB is no more meaningful. Memory asked in MiB is
    refused on such cards before this (it cannot be checked)."""
    if backend == "none" or gpus <= 0:
        return ()
    if backend == "hami-core":
        env = [(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", f"{memory_mib}m") for i in range(gpus) if memory_mib > 0]
        if cores < 100:  # 0 too, as HAMi's device plugin writes it: HAMi-core reads 0 as no compute cap
            env.append(("CUDA_DEVICE_SM_LIMIT", str(cores)))
        return tuple(env)
    if backend == "mps":
        pinned = (("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ",".join(f"{i}={memory_mib}M" for i in range(gpus))),
                  ) if memory_mib > 0 else ()
        if cores == 0:  # best effort: no percentage, so the client may use every SM
            return pinned
        return (("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(cores)), *pinned)
    raise ValueError(f"unknown enforcement backend {backend!r}")


_SM_DEVICE_VAR = re.compile(r"^CUDA_DEVICE_SM_LIMIT_\d+$")


def is_limit_env(name: str) -> bool:
    """True for the variables this product writes (a user must not set them): the backends' limits,
    and HAMi-core's per-device compute limits that pin a container with an unread envFrom source."""
    return bool(_MEMORY_VAR.match(name)) or name in BACKEND_PREFIXES[1:] or is_sm_device_env(name)


def is_sm_device_env(name: str) -> bool:
    """HAMi-core's `CUDA_DEVICE_SM_LIMIT_<i>`: above 0 it overrides CUDA_DEVICE_SM_LIMIT for device i."""
    return bool(_SM_DEVICE_VAR.match(name))


# ---------------------------------------------------------------------------------------------
# Every variable a container must not set itself, in one place, with the layer that reads it.
# A pod (env or envFrom, any kind of container) setting one of these is refused; each either widens
# the devices a container sees or loosens or switches off a limit.
# ---------------------------------------------------------------------------------------------

ISOLATION_ENV: dict[str, str] = {
    # NVIDIA container toolkit (runtime hook / CDI modifier), read from the container's environment: the
    # variables that widen what a container reaches beyond the GPUs the device plugin gave it
    # (TOOLKIT_NARROW_ENV below lists the toolkit's others, and why they do not).
    "NVIDIA_VISIBLE_DEVICES": "container toolkit: which GPUs are mounted into the container",
    "NVIDIA_MIG_CONFIG_DEVICES": "container toolkit: MIG configuration capability on these GPUs (the whole card)",
    "NVIDIA_MIG_MONITOR_DEVICES": "container toolkit: MIG monitoring capability on these GPUs (the whole card)",
    "NVIDIA_IMEX_CHANNELS": "container toolkit: IMEX channels mounted, which import GPU memory other nodes export",
    # The feature-gated three mount node devices no device plugin allocated (internal/discover/gds.go,
    # mofed.go, nvswitch.go). GDS also bind-mounts the node's /run/udev, and udevd's control socket there
    # takes commands from any root process: a read-only mount does not stop a connect().
    "NVIDIA_GDS": "container toolkit: /dev/nvidia-fs* and the node's /run/udev (udevd's control socket)",
    "NVIDIA_MOFED": "container toolkit: every RDMA device of the node mounted (/dev/infiniband/uverbs*)",
    "NVIDIA_NVSWITCH": "container toolkit: the node's NVSwitch fabric devices mounted (/dev/nvidia-nvswitch*)",
    # HAMi-core (libvgpu.so; src/libvgpu.c, src/multiprocess/multiprocess_memory_limit.c).
    "CUDA_DEVICE_MEMORY_LIMIT": "HAMi-core: memory limit of every GPU without its own _<i> limit",
    "CUDA_DEVICE_SM_LIMIT": "HAMi-core: compute limit (0 means none)",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": "HAMi-core: file of the shared accounting region (a private one escapes it)",
    "GPU_CORE_UTILIZATION_POLICY": "HAMi-core: 'disable' switches the compute limit off",
    "ACTIVE_OOM_KILLER": "HAMi-core: 'false' stops killing processes over their memory limit",
    "CUDA_TASK_PRIORITY": "HAMi-core: priority over the other tasks sharing the GPU",
    "CUDA_REDIRECT": "HAMi-core: path of the library loaded in place of libvgpu.so",
    "CUDA_OVERSUBSCRIBE": "HAMi libvgpu: memory beyond the card (HAMi's device plugin sets it)",
    "CUDA_DISABLE_CONTROL": "HAMi device plugin: skips mounting /etc/ld.so.preload, so no limit at all",
    # The dynamic loader: a library loaded before /etc/ld.so.preload can undo HAMi-core's hooks.
    "LD_PRELOAD": "dynamic loader: libraries loaded before the limit library",
}
# What to ask for instead of a widening variable that selects no GPU (the default: GPUs in resources).
WIDENING_HINTS: dict[str, str] = {
    "NVIDIA_MOFED": "ask for RDMA devices from their device plugin in resources.limits (e.g. rdma/roce_gdr: 1)",
    "NVIDIA_NVSWITCH": "use NVLink as it is: traffic through the switches needs no switch device in the "
                       "container",
}
# Families, by prefix: HAMi-core's per-device limits (CUDA_DEVICE_MEMORY_LIMIT_<i>, CUDA_DEVICE_SM_LIMIT_<i>)
# and the CUDA MPS client's variables (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY,
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA_MPS_CLIENT_PRIORITY,
# CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING, ...): all of them steer the limit layer.
ISOLATION_PREFIXES: tuple[str, ...] = ("CUDA_DEVICE_", "CUDA_MPS_")
# CUDA_DEVICE_* variables of the CUDA runtime that only order or tune what the container already sees.
BENIGN_ENV: frozenset[str] = frozenset({"CUDA_DEVICE_ORDER", "CUDA_DEVICE_MAX_CONNECTIONS",
                                        "CUDA_DEVICE_MAX_COPY_CONNECTIONS"})
# Harmless on purpose, so left out: LIBCUDA_LOG_LEVEL and RECORD_KERNEL_INTERVAL (HAMi-core logging and
# sampling), CUDA_VISIBLE_DEVICES (only narrows what the container already has), and the toolkit's
# variables below.
# The NVIDIA container toolkit's variables that reach nothing beyond the container's own GPUs, with what
# the toolkit does for each (internal/config/image/cuda_image.go, internal/modifier/gated.go and cdi.go,
# internal/modifier/graphics.go, internal/discover/gdrcopy.go). NVIDIA_GDRCOPY, like the other
# feature-gated ones, acts only in a container the toolkit already gives GPUs to, and only for "enabled".
TOOLKIT_NARROW_ENV: dict[str, str] = {
    "NVIDIA_GDRCOPY": "mounts /dev/gdrdrv, which maps the calling process's own GPU memory for the CPU",
    "NVIDIA_DRIVER_CAPABILITIES": "which driver libraries are mounted; graphics and display add the DRM "
                                  "nodes of the container's own GPUs only",
    "NVIDIA_REQUIRE_CUDA": "a driver version the image needs (NVIDIA_REQUIRE_* alike): a check, no device",
    "NVIDIA_DISABLE_REQUIRE": "skips those checks: no device",
    "CUDA_VERSION": "without NVIDIA_REQUIRE_CUDA, read as every GPU only while NVIDIA_VISIBLE_DEVICES is "
                    "unset; the device plugin sets that in every GPU container, and every other container "
                    "that can reach a GPU node gets void from the webhook (or is refused)",
}
# Only matters in a GPU pod: common in CPU images (jemalloc, tcmalloc), where no limit library runs.
GPU_POD_ONLY_ENV: frozenset[str] = frozenset({"LD_PRELOAD"})
# The one value of a device variable that grants nothing: the toolkit mounts no GPU for "void".
NO_DEVICES = "void"


def is_isolation_env(name: str) -> bool:
    """A variable of the table above (exact name or family), whoever sets it."""
    if name in ISOLATION_ENV:
        return True
    return name.startswith(ISOLATION_PREFIXES) and name not in BENIGN_ENV


# ---------------------------------------------------------------------------------------------
# Pins: what a GPU container gets as explicit `env` entries when it takes envFrom from a source the
# webhook cannot read (a Secret). The kubelet applies envFrom first and env after, so each entry wins
# over whatever the Secret says. Each value is the one the reader treats as "off" (or its default):
# - GPU_CORE_UTILIZATION_POLICY: HAMi-core acts only on "force" and "disable"; anything else is its default.
# - ACTIVE_OOM_KILLER: HAMi-core stops killing over the limit only for "false" or "0".
# - CUDA_TASK_PRIORITY: HAMi-core's region priority is 1 unless set (0 takes precedence over others).
# - CUDA_OVERSUBSCRIBE, CUDA_DISABLE_CONTROL: HAMi parses them as booleans; "false" is their default.
# - CUDA_REDIRECT: HAMi-core dlopens it only when set and non-empty; empty is the same as unset.
# - CUDA_DEVICE_MEMORY_SHARED_CACHE: a file in the directory HAMi's device plugin mounts into each GPU
#   container (`<hookPath>/vgpu`, from the node's `vgpu/containers/<pod uid>_<container>`), which HAMi's
#   monitor reads for the container's usage and priority. The kubelet lays the pod's env after the
#   plugin's own value (a fresh `<uuid>.cache` there), so the pin replaces it with a name in the same
#   place: still the one `.cache` file the monitor finds (pkg/monitor/nvidia/cudevshr.go). HAMi-core's own
#   default, /tmp/cudevshr.cache, would take the container off that path. Where the directory does not
#   exist (another hookPath), HAMi-core cannot open the file and exits (multiprocess_memory_limit.c
#   try_create_shrreg): the pin never loosens a limit.
# - LD_PRELOAD: the dynamic loader preloads nothing for an empty value (an image's own LD_PRELOAD, which
#   env overrides too, is dropped in such a container).
# - NVIDIA_GDS / _MOFED / _NVSWITCH: the toolkit mounts those devices only for "enabled".
# Not pinned, and why:
# - NVIDIA_VISIBLE_DEVICES, NVIDIA_IMEX_CHANNELS: the device plugin writes the first into a GPU container,
#   and a pod's entry would replace its device list; "void" is no answer for IMEX either. The toolkit
#   reads both from an unprivileged container only with accept-nvidia-visible-devices-envvar-when-
#   unprivileged (its default), so a container that may take them from a Secret is admitted only where
#   every GPU node reports that setting off (DEVICE_SELECTING).
# - NVIDIA_MIG_CONFIG_DEVICES, NVIDIA_MIG_MONITOR_DEVICES: the toolkit hook refuses to start an
#   unprivileged container that sets them, and privileged GPU containers are refused already.
# - CUDA_DEVICE_MEMORY_LIMIT[_<i>], CUDA_DEVICE_SM_LIMIT and the MPS pair: written by this product where
#   they limit anything (explicit entries win); where absent, a Secret's value can only add a limit.
#   HAMi-core's CUDA_DEVICE_SM_LIMIT_<i> overrides the shared compute limit, so a capped container gets it
#   pinned per device to its own cap (see env_pins.py).
# - CUDA_MPS_PIPE_DIRECTORY / _LOG_DIRECTORY / _CLIENT_PRIORITY: set by the MPS setup or lowering only.
# ---------------------------------------------------------------------------------------------

# The accounting file pinned for HAMi-core: in the per-container directory of HAMi's default hookPath.
HAMI_SHARED_CACHE = "/usr/local/vgpu/gpu-admission.cache"

ENV_FROM_PINS: dict[str, str] = {
    "GPU_CORE_UTILIZATION_POLICY": "default",
    "ACTIVE_OOM_KILLER": "true",
    "CUDA_TASK_PRIORITY": "1",
    "CUDA_OVERSUBSCRIBE": "false",
    "CUDA_DISABLE_CONTROL": "false",
    "CUDA_REDIRECT": "",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": HAMI_SHARED_CACHE,
    "LD_PRELOAD": "",
    "NVIDIA_GDS": "disabled",
    "NVIDIA_MOFED": "disabled",
    "NVIDIA_NVSWITCH": "disabled",
}
# Variables that choose devices and that no env entry can pin in a GPU container (above).
DEVICE_SELECTING: tuple[str, ...] = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_IMEX_CHANNELS")


def is_pin(name: str, entry: Mapping[str, object]) -> bool:
    """An env entry that sets a pinned variable to its safe value (the API server drops an empty
    `value`, so a missing one reads as empty, as the kubelet sets it)."""
    if name not in ENV_FROM_PINS or "valueFrom" in entry:
        return False
    value = entry.get("value", "")
    return value == ENV_FROM_PINS[name]
