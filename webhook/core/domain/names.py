"""The product's names, each spelled once here: the inventory's API group and kind, the annotations and
labels it reads and writes, the labels of its ledgers, the quota keys it enforces, the placement
policies it knows. The Helm chart spells the same names in YAML;
tests/domain/test_names.py checks that the two agree."""

from __future__ import annotations

# The GPUInventory custom resource (charts/gpu-admission/crds).
GROUP = "gpu-admission.io"
INVENTORY_VERSION = "v1alpha1"
INVENTORY_KIND = "GPUInventory"
INVENTORY_PLURAL = "gpuinventories"

# Pod annotations: the decision record the webhook writes, and what a pod may ask of placement.
ALLOCATION = f"{GROUP}/allocation"
PLACEMENT = f"{GROUP}/placement"
TOPOLOGY = f"{GROUP}/topology"
GROUP_ANNOTATION = f"{GROUP}/group"
GROUP_SIZE_ANNOTATION = f"{GROUP}/group-size"
GROUP_TOPOLOGY_ANNOTATION = f"{GROUP}/group-topology"
# The label the mutation puts on every GPU pod it admits (the chart's validating webhooks select on it).
MANAGED_LABEL = f"{GROUP}/managed"
# The namespace label that opts a namespace in (policy `managedNamespaces: labelled`).
ENABLED_LABEL = f"{GROUP}/enabled"
# A node's inventory written by hand or by another tool, when no GPUInventory exists.
INVENTORY_ANNOTATION = f"{GROUP}/inventory"

# The ConfigMaps of the reservation and group ledgers.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
LEDGER_LABEL = f"{GROUP}/ledger"
LEDGER_NAMESPACE_ANNOTATION = f"{GROUP}/ledger-namespace"

# The ResourceQuota keys the API server ignores and the webhook enforces: GPUs, MiB per GPU x GPUs,
# percent of compute per GPU x GPUs.
QUOTA_GPUS = "requests.nvidia.com/gpu"
QUOTA_MEMORY = "limits.nvidia.com/gpumem"
QUOTA_CORES = "limits.nvidia.com/gpucores"

# Placement policies (node choice), and the GPU policies inside a node.
PLACEMENT_POLICIES = ("random", "best-fit", "dot-product", "binpack", "spread", "fewest-tasks", "fragmentation")
GPU_PLACEMENTS = ("binpack", "spread")
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU Feature Discovery's model label, required affinity's key
