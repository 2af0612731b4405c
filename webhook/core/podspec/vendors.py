"""The names this package's readers imported from here before it was split by subject, importable from
here still. New code imports them from their own modules:

* `vendor_table`: the vendor table (a new vendor is one row there) and every lookup of it;
* `fastpath`: whether a pod needs a decision (`is_gpu_pod`, `needs_decision`);
* `coerce`: fields of decoded JSON as mappings and lists;
* `hostpaths`: hostPath volumes that expose GPU devices;
* `kai`: KAI-Scheduler's share annotations; `dialects`: HAMi's and Volcano's;
* `envvars`: limit and bypass variables in a container's env; `accelerators`: accelerators outside the table.
"""

from __future__ import annotations

from .accelerators import foreign_accelerator_message, foreign_accelerators, has_foreign_accelerator, looks_like_gpu
from .coerce import containers_of, is_mapping, list_of, mapping_of
from .dialects import (
    HAMI_GPU_POLICIES,
    HAMI_GPU_POLICY,
    HAMI_NODE_POLICY,
    HAMI_NUMA_BIND,
    HAMI_POLICIES,
    VGPU_MODES,
)
from .envvars import is_bypass_entry, is_bypass_env, is_limit_env, limit_env_of
from .fastpath import GPU_REQUEST_ANNOTATIONS, is_gpu_pod, may_reach_gpu, needs_decision
from .hostpaths import GPU_HOST_PATHS, is_device_hostpath, normal_host_path
from .kai import KAI_FRACTION, KAI_FRACTION_CONTAINER, KAI_FRACTION_DEVICES, KAI_MEMORY, kai_request
from .vendor_table import (
    ADVERTISED_BY_NAME,
    COUNT_RESOURCES,
    CUDA_ENFORCED,
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS,
    MIG_PREFIX,
    NOT_DEVICES,
    SCHEDULER_RESOURCES,
    SELECTORS,
    TOPOLOGY_MODELLED,
    VENDOR_DOMAINS,
    VENDORS,
    VendorResources,
    classify_resource,
    count_name_of,
    device_kind,
    enforced_backend,
    is_gpu_resource,
    kept_for_scheduler,
    memory_name,
    mig_memory_of_name,
    mig_profile,
    selector_names,
    unenforced_slice,
    vendor_of_resource,
)

__all__ = [
    "ADVERTISED_BY_NAME", "COUNT_RESOURCES", "CUDA_ENFORCED", "GPU_HOST_PATHS", "GPU_REQUEST_ANNOTATIONS",
    "HAMI_GPU_POLICIES", "HAMI_GPU_POLICY", "HAMI_NODE_POLICY", "HAMI_NUMA_BIND", "HAMI_POLICIES",
    "KAI_FRACTION", "KAI_FRACTION_CONTAINER", "KAI_FRACTION_DEVICES", "KAI_MEMORY", "MAX_GPUS",
    "MAX_GPU_MEMORY_MIB", "MIG_PREFIX", "NOT_DEVICES", "SCHEDULER_RESOURCES", "SELECTORS", "TOPOLOGY_MODELLED",
    "VENDORS", "VENDOR_DOMAINS", "VGPU_MODES", "VendorResources", "classify_resource", "containers_of",
    "count_name_of", "device_kind", "enforced_backend", "foreign_accelerator_message", "foreign_accelerators",
    "has_foreign_accelerator", "is_bypass_entry", "is_bypass_env", "is_device_hostpath", "is_gpu_pod",
    "is_gpu_resource", "is_limit_env", "is_mapping", "kai_request", "kept_for_scheduler", "limit_env_of",
    "list_of", "looks_like_gpu", "mapping_of", "may_reach_gpu", "memory_name", "mig_memory_of_name",
    "mig_profile", "needs_decision", "normal_host_path", "selector_names", "unenforced_slice",
    "vendor_of_resource",
]
