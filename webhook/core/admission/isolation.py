"""Routes to a GPU that the allocation rules alone do not see, one module each; this module names them
all, for callers that import them from one place:

- `envfrom.py`: what a pod's `envFrom` takes (ConfigMaps the webhook reads, sources it cannot), a GPU
  pod's envFrom screened (`screen_gpu`) and the pins written for unread sources (`pin_ops`, with
  `env_pins.py`);
- `neutralise.py`: NVIDIA_VISIBLE_DEVICES=void, written into containers that must see no GPU (a GPU pod's
  sidecars: `sidecar_ops`) and looked for by the validation;
- `no_gpu_reach.py`: a pod asking for no GPU that can still reach one (`after_screen`);
- `ephemeral.py`: containers added by `kubectl debug`;
- `configmap_readers.py` and `configmap_writes.py`: the live GPU pods that read a ConfigMap through
  envFrom, and a write of that ConfigMap decided against them.
"""

from __future__ import annotations

from .configmap_readers import (
    ALL_KINDS,
    NO_POD_READS,
    NO_READS,
    TERMINAL_PHASES,
    Reads,
    config_map_reads,
    env_reads,
    with_env_reads,
)
from .configmap_writes import MAX_REFUSALS, config_map_refusals, config_map_write
from .envfrom import (
    _FAMILY_TAILS,
    _TAILS,
    env_from,
    env_from_keys,
    layer_of,
    missing_pins,
    pin_ops,
    refused_keys,
    screen_gpu,
)
from .ephemeral import ephemeral
from .neutralise import VISIBLE, VOID, missing_sidecar_void, sidecar_ops, sidecar_targets, void_ops
from .no_gpu_reach import FOREIGN_ACCELERATOR, GPU_TAINT_KEYS, NO_GPU_ANSWERS, after_screen, reach, screen_non_gpu

__all__ = [
    "ALL_KINDS", "FOREIGN_ACCELERATOR", "GPU_TAINT_KEYS", "MAX_REFUSALS", "NO_GPU_ANSWERS", "NO_POD_READS",
    "NO_READS", "TERMINAL_PHASES", "VISIBLE", "VOID", "_FAMILY_TAILS", "_TAILS", "Reads", "after_screen",
    "config_map_reads", "config_map_refusals", "config_map_write", "env_from", "env_from_keys", "env_reads",
    "ephemeral", "layer_of", "missing_pins", "missing_sidecar_void", "pin_ops", "reach", "refused_keys",
    "screen_gpu", "screen_non_gpu", "sidecar_ops", "sidecar_targets", "void_ops", "with_env_reads",
]
