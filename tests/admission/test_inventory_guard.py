"""GPUInventory admission: node-bound writers keep to their own node; every spec keeps to the format."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from webhook.core.admission.inventory_guard import check_inventory_write
from webhook.core.domain.decision import Decision
from webhook.core.domain.model import Gpu
from webhook.core.podspec.inventory import InventoryError, inventory_from_json

SPEC: dict[str, Any] = {
    "version": 1,
    "gpus": [
        {"index": 0, "uuid": "GPU-0", "model": "NVIDIA-H100-80GB-HBM3", "memoryMiB": 81559, "numa": 0,
         "healthy": True, "migMode": False, "nvlinkRemoteBusIds": ["0000:05:00.0"]},
        {"index": 1, "uuid": "GPU-1", "model": "NVIDIA-H100-80GB-HBM3", "memoryMiB": 81559, "numa": 1,
         "healthy": False},
    ],
    "nvlink": [[0, 18], [18, 0]],
    "pcie": [["X", "SYS"], ["SYS", "X"]],
}  # fmt: skip
NODE_BOUND = {
    "username": "system:serviceaccount:gpu-admission:gpu-admission-agent",
    "extra": {
        "authentication.kubernetes.io/node-name": ["gpu-node-1"],
        "authentication.kubernetes.io/node-uid": ["5c8f1f2e-0000-4000-8000-000000000001"],
    },
}
UNBOUND = {"username": "admin", "groups": ["system:masters"]}


def request(
    name: str = "gpu-node-1",
    operation: str = "CREATE",
    user: dict | None = None,
    spec: Any = SPEC,
    resource: str = "gpuinventories",
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "gpu-admission.io/v1alpha1",
        "kind": "GPUInventory",
        "metadata": {"name": name},
        "spec": copy.deepcopy(spec),
    }
    review: dict[str, Any] = {
        "uid": "4f1c0c3e-0000-4000-8000-000000000000",
        "kind": {"group": "gpu-admission.io", "version": "v1alpha1", "kind": "GPUInventory"},
        "resource": {"group": "gpu-admission.io", "version": "v1alpha1", "resource": resource},
        "name": name,
        "operation": operation,
        "userInfo": NODE_BOUND if user is None else user,
        "object": obj if operation != "DELETE" else None,
        "oldObject": obj if operation != "CREATE" else None,
    }
    return review


ALLOWED = Decision(allowed=True, gpu_pod=False)


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_node_bound_writer_may_write_its_own_inventory(operation: str) -> None:
    assert check_inventory_write(request(operation=operation)) == ALLOWED


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_node_bound_writer_may_not_write_another_nodes_inventory(operation: str) -> None:
    assert check_inventory_write(request(name="gpu-node-2", operation=operation)) == Decision(
        allowed=False,
        code=403,
        reason="inventory-node-mismatch",
        message="GPUInventory 'gpu-node-2': a token bound to node 'gpu-node-1' may only write "
        "the GPUInventory named 'gpu-node-1'",
        gpu_pod=False,
    )


def test_node_bound_writer_without_a_name_is_refused() -> None:
    review = request(name="")
    review["object"]["metadata"] = {"generateName": "gpu-node-"}
    decision = check_inventory_write(review)
    assert (decision.allowed, decision.code) == (False, 403)
    assert decision.message.startswith("GPUInventory without a name: a token bound to node 'gpu-node-1'")


def test_name_is_read_from_the_object_when_the_request_has_none() -> None:
    review = request(name="gpu-node-2")
    review["name"] = ""
    assert check_inventory_write(review).reason == "inventory-node-mismatch"


def test_token_naming_two_nodes_is_refused() -> None:
    user = {
        "username": "x",
        "extra": {"authentication.kubernetes.io/node-name": ["gpu-node-1", "gpu-node-2"]},
    }
    assert check_inventory_write(request(user=user)) == Decision(
        allowed=False,
        code=403,
        reason="inventory-node-mismatch",
        message="GPUInventory 'gpu-node-1': the writer's token names several nodes (gpu-node-1, gpu-node-2)",
        gpu_pod=False,
    )


@pytest.mark.parametrize("user", [UNBOUND, {"username": "x", "extra": {}}, {"username": "x", "extra": None}, {}])
def test_writer_not_bound_to_a_node_may_write_any_inventory(user: dict) -> None:
    assert check_inventory_write(request(name="gpu-node-7", user=user)) == ALLOWED


def test_malformed_spec_is_refused_with_the_field() -> None:
    spec = copy.deepcopy(SPEC)
    spec["gpus"][1]["memoryMiB"] = "80Gi"
    assert check_inventory_write(request(spec=spec)) == Decision(
        allowed=False,
        code=422,
        reason="invalid-inventory",
        message="GPUInventory 'gpu-node-1': spec.gpus[1].memoryMiB: must be an integer, got '80Gi'",
        gpu_pod=False,
    )


def test_malformed_spec_from_an_unbound_writer_is_refused_too() -> None:
    spec = copy.deepcopy(SPEC)
    spec["nvlink"] = [[0, 18], [12, 0]]
    decision = check_inventory_write(request(user=UNBOUND, spec=spec, operation="UPDATE"))
    assert (decision.code, decision.message) == (
        422,
        "GPUInventory 'gpu-node-1': spec.nvlink[1][0]: must equal spec.nvlink[0][1] (18), got 12",
    )


def test_missing_spec_is_refused() -> None:
    review = request()
    del review["object"]["spec"]
    assert check_inventory_write(review).message == "GPUInventory 'gpu-node-1': spec: required"


def test_delete_of_own_object_needs_no_spec() -> None:
    review = request(operation="DELETE")
    review["oldObject"]["spec"] = {"broken": True}
    assert check_inventory_write(review) == ALLOWED


@pytest.mark.parametrize(
    "review",
    [
        request(resource="pods"),
        {**request(name="gpu-node-2"), "subResource": "status"},
        {**request(name="gpu-node-2"), "operation": "CONNECT"},
        {"uid": "x"},
    ],
)
def test_other_requests_are_not_this_guards_business(review: dict) -> None:
    assert check_inventory_write(review) == ALLOWED


# -- the inventory format itself ----------------------------------------------------------------


def test_valid_inventory_gives_gpus_and_matrices() -> None:
    assert inventory_from_json(SPEC) == (
        (
            Gpu(index=0, uuid="GPU-0", model="NVIDIA-H100-80GB-HBM3", memory_mib=81559, numa=0, healthy=True),
            Gpu(index=1, uuid="GPU-1", model="NVIDIA-H100-80GB-HBM3", memory_mib=81559, numa=1, healthy=False),
        ),
        ((0, 18), (18, 0)),
        (("X", "SYS"), ("SYS", "X")),
    )


def test_empty_inventory_is_valid() -> None:
    assert inventory_from_json({"version": 1, "gpus": [], "nvlink": [], "pcie": []}) == ((), (), ())


def edit(path: str, value: Any) -> dict[str, Any]:
    """SPEC with one value replaced (or removed, for value DELETE); path like "gpus.0.uuid"."""
    spec = copy.deepcopy(SPEC)
    *parents, last = path.split(".")
    target: Any = spec
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    key: Any = int(last) if isinstance(target, list) else last
    if value is DELETE:
        del target[key]
    else:
        target[key] = value
    return spec


DELETE = object()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "spec: must be an object, got a list"),
        (edit("version", 2), "spec.version: must be 1, got 2"),
        (edit("version", True), "spec.version: must be 1, got True"),
        (edit("pcie", DELETE), "spec.pcie: required"),
        (edit("extra", 1), "spec.extra: unknown field (known: version, gpus, nvlink, pcie, toolkit, vendor)"),
        (edit("gpus", {}), "spec.gpus: must be a list, got an object"),
        (edit("gpus.0", "GPU-0"), "spec.gpus[0]: must be an object, got a string"),
        (edit("gpus.0.uuid", DELETE), "spec.gpus[0].uuid: required"),
        (edit("gpus.0.uuid", ""), "spec.gpus[0].uuid: must be a non-empty string, got ''"),
        (edit("gpus.1.uuid", "GPU-0"), "spec.gpus[1].uuid: duplicate uuid 'GPU-0'"),
        (edit("gpus.1.index", 0), "spec.gpus[1].index: duplicate index 0"),
        (edit("gpus.0.index", -1), "spec.gpus[0].index: must be at least 0, got -1"),
        (edit("gpus.0.memoryMiB", 0), "spec.gpus[0].memoryMiB: must be at least 1, got 0"),
        (edit("gpus.0.memoryMiB", 81559.5), "spec.gpus[0].memoryMiB: must be an integer, got 81559.5"),
        (edit("gpus.0.healthy", "yes"), "spec.gpus[0].healthy: must be true or false, got 'yes'"),
        (edit("gpus.0.numa", None), "spec.gpus[0].numa: must be an integer, got None"),
        (edit("gpus.0.migMode", 1), "spec.gpus[0].migMode: must be true or false, got 1"),
        (edit("gpus.0.nvlinkRemoteBusIds", [3]),
         "spec.gpus[0].nvlinkRemoteBusIds[0]: must be a non-empty string, got 3"),
        (edit("gpus.0.memoryMib", 1),
         "spec.gpus[0].memoryMib: unknown field (known: index, uuid, model, memoryMiB, numa, healthy, "
         "migMode, migDevices, nvlinkRemoteBusIds)"),
        (edit("nvlink", [[0, 18]]), "spec.nvlink: must have one row per GPU (2), got 1"),
        (edit("nvlink.1", [18]), "spec.nvlink[1]: must have one entry per GPU (2), got 1"),
        (edit("nvlink.0.0", 4), "spec.nvlink[0][0]: a GPU has no links to itself, must be 0"),
        (edit("nvlink.0.1", -18), "spec.nvlink[0][1]: must be at least 0, got -18"),
        (edit("pcie.0.1", "NV18"), "spec.pcie[0][1]: must be one of X, PIX, PXB, PHB, NODE, SYS, got 'NV18'"),
        (edit("pcie.0.0", "SYS"), "spec.pcie[0][0]: must be X, got 'SYS'"),
        (edit("pcie.0.1", "X"), "spec.pcie[0][1]: must be a path level other than X, got 'X'"),
        (edit("pcie.1.0", "NODE"), "spec.pcie[1][0]: must equal spec.pcie[0][1] (SYS), got 'NODE'"),
    ],
)  # fmt: skip
def test_format_errors_name_the_field(spec: Any, message: str) -> None:
    with pytest.raises(InventoryError) as raised:
        inventory_from_json(spec)
    assert str(raised.value) == message


def test_inventory_error_is_a_value_error_and_the_prefix_is_the_callers() -> None:
    with pytest.raises(ValueError, match=r"^metadata\.annotations\[gpu-admission\.io/inventory\]\.version: "):
        inventory_from_json(edit("version", 0), "metadata.annotations[gpu-admission.io/inventory]")
