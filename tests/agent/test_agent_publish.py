"""Publishing the GPUInventory: create once, no write when unchanged, replace when changed, retry."""

from __future__ import annotations

import fake_nvml
import pytest
from fake_custom_objects import FakeCustomObjects

from webhook.agent.discovery import discover
from webhook.agent.publish import InventoryPublisher, PublishError, inventory_object, inventory_status, nvlink_summary


def machine_spec(machine=fake_nvml.dgx_h100) -> dict:
    nvml = machine()
    nvml.nvmlInit()
    return discover(nvml)


@pytest.fixture
def api() -> FakeCustomObjects:
    return FakeCustomObjects()


def test_first_pass_creates_the_object_named_after_the_node(api: FakeCustomObjects) -> None:
    spec = machine_spec()
    status = inventory_status(spec, "550.90.07")
    assert InventoryPublisher(api, "gpu-node-1").publish(spec, status) == "created"
    assert api.calls == [("get", "gpu-node-1"), ("create", "gpu-node-1")]
    stored = api.objects["gpu-node-1"]
    assert stored["apiVersion"] == "gpu-admission.io/v1alpha1"
    assert stored["kind"] == "GPUInventory"
    assert stored["metadata"]["name"] == "gpu-node-1"
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpu-admission-agent"}
    assert stored["spec"] == spec
    assert stored["status"] == {
        "gpuCount": 8,
        "model": "NVIDIA-H100-80GB-HBM3",
        "nvlink": "NV18",
        "driverVersion": "550.90.07",
    }


def test_no_write_when_nothing_changed(api: FakeCustomObjects) -> None:
    publisher = InventoryPublisher(api, "gpu-node-1")
    spec = machine_spec()
    publisher.publish(spec, inventory_status(spec, "550.90.07"))
    api.calls.clear()
    for _ in range(3):
        assert publisher.publish(machine_spec(), inventory_status(spec, "550.90.07")) == "unchanged"
    assert api.calls == [("get", "gpu-node-1")] * 3
    assert api.objects["gpu-node-1"]["metadata"]["resourceVersion"] == "1"


def test_replace_when_the_spec_changed_keeping_foreign_labels(api: FakeCustomObjects) -> None:
    publisher = InventoryPublisher(api, "gpu-node-1")
    spec = machine_spec()
    publisher.publish(spec, inventory_status(spec, "550.90.07"))
    api.objects["gpu-node-1"]["metadata"]["labels"]["team"] = "ml"
    changed = fake_nvml.with_gpu(fake_nvml.dgx_h100(), 4, remapped_rows=(0, 2, 1, 0))
    changed.nvmlInit()
    new_spec = discover(changed)
    api.calls.clear()
    assert publisher.publish(new_spec, inventory_status(new_spec, "550.90.07")) == "replaced"
    assert api.calls == [("get", "gpu-node-1"), ("replace", "gpu-node-1")]
    stored = api.objects["gpu-node-1"]
    assert stored["spec"]["gpus"][4]["healthy"] is False
    assert stored["metadata"]["labels"] == {
        "team": "ml",
        "app.kubernetes.io/managed-by": "gpu-admission-agent",
    }
    assert stored["metadata"]["resourceVersion"] == "2"


def test_replace_when_only_the_driver_changed(api: FakeCustomObjects) -> None:
    publisher = InventoryPublisher(api, "gpu-node-1")
    spec = machine_spec()
    publisher.publish(spec, inventory_status(spec, "550.90.07"))
    assert publisher.publish(spec, inventory_status(spec, "560.35.03")) == "replaced"
    assert api.objects["gpu-node-1"]["status"]["driverVersion"] == "560.35.03"


def test_deleted_object_is_created_again(api: FakeCustomObjects) -> None:
    publisher = InventoryPublisher(api, "gpu-node-1")
    spec = machine_spec()
    publisher.publish(spec, inventory_status(spec, ""))
    del api.objects["gpu-node-1"]
    assert publisher.publish(spec, inventory_status(spec, "")) == "created"
    assert "driverVersion" not in api.objects["gpu-node-1"]["status"]


def test_conflict_on_replace_is_retried_on_a_fresh_read(api: FakeCustomObjects) -> None:
    publisher = InventoryPublisher(api, "gpu-node-1")
    spec = machine_spec()
    publisher.publish(spec, inventory_status(spec, "1"))
    api.calls.clear()
    api.fail["replace"] = [409]
    assert publisher.publish(spec, inventory_status(spec, "2")) == "replaced"
    assert api.calls == [("get", "gpu-node-1"), ("replace", "gpu-node-1")] * 2


def test_create_racing_another_writer_reads_and_compares_again(api: FakeCustomObjects) -> None:
    spec = machine_spec()
    api.fail["create"] = [409]
    api.objects["gpu-node-1"] = api._stored(inventory_object("gpu-node-1", spec, inventory_status(spec, "1")))
    api.fail["get"] = [404]  # the first read happens before the other writer's create
    assert InventoryPublisher(api, "gpu-node-1").publish(spec, inventory_status(spec, "1")) == "unchanged"
    assert api.calls == [("get", "gpu-node-1"), ("create", "gpu-node-1"), ("get", "gpu-node-1")]


def test_endless_conflicts_give_up_with_one_line(api: FakeCustomObjects) -> None:
    publisher = InventoryPublisher(api, "gpu-node-1")
    spec = machine_spec()
    publisher.publish(spec, inventory_status(spec, "1"))
    api.fail["replace"] = [409, 409, 409]
    with pytest.raises(PublishError, match=r"^GPUInventory 'gpu-node-1': gave up after 3 conflicting writes$"):
        publisher.publish(spec, inventory_status(spec, "2"))


def test_forbidden_says_which_rights_are_missing(api: FakeCustomObjects) -> None:
    api.fail["create"] = [403]
    spec = machine_spec()
    with pytest.raises(PublishError) as raised:
        InventoryPublisher(api, "gpu-node-1").publish(spec, inventory_status(spec, "1"))
    assert str(raised.value) == (
        "cannot create GPUInventory 'gpu-node-1': HTTP 403 Forbidden: injected 403"
        " (the agent's service account needs get, create and update on gpuinventories)"
    )


def test_api_server_message_is_passed_on(api: FakeCustomObjects) -> None:
    api.fail["get"] = [500]
    spec = machine_spec()
    with pytest.raises(PublishError, match=r"^cannot read GPUInventory 'gpu-node-1': HTTP 500 Error: injected 500$"):
        InventoryPublisher(api, "gpu-node-1").publish(spec, inventory_status(spec, "1"))


@pytest.mark.parametrize(
    ("machine", "summary"),
    [
        (fake_nvml.dgx_h100, "NV18"),
        (fake_nvml.dgx_a100, "NV12"),
        (fake_nvml.pcie_server_bridged, "partial NV4"),
        (fake_nvml.pcie_box, "none"),
    ],
)
def test_nvlink_summary_of_each_machine(machine, summary: str) -> None:
    assert nvlink_summary(machine_spec(machine)["nvlink"]) == summary


def test_nvlink_summary_of_uneven_full_mesh_and_single_gpu() -> None:
    assert nvlink_summary([[0, 18, 16], [18, 0, 16], [16, 16, 0]]) == "NV16-NV18"
    assert nvlink_summary([[0]]) == "none"
