"""The node agent's discovery against fake NVML machines: the inventory JSON, exactly."""

from __future__ import annotations

import json
from pathlib import Path

import fake_nvml
import jsonschema
import pytest
import yaml
from fake_nvml import GPU, SWITCH, Link, with_gpu

from webhook.agent.discovery import discover, gfd_model_name, normalise_bus_id
from webhook.core.podspec.inventory import inventory_from_json

CRD = Path(__file__).resolve().parents[2] / "charts" / "gpu-admission" / "crds" / "gpuinventory.yaml"


def inventory(nvml: fake_nvml.FakeNvml) -> dict:
    nvml.nvmlInit()
    return discover(nvml)


def uniform(size: int, count: int) -> list[list[int]]:
    return [[0 if i == j else count for j in range(size)] for i in range(size)]


H100_SWITCH_PORTS = ["0000:05:00.0"] * 5 + ["0000:06:00.0"] * 4 + ["0000:07:00.0"] * 4 + ["0000:08:00.0"] * 5
A100_SWITCH_PORTS = [f"0000:c{n}:00.0" for n in range(4, 10) for _ in range(2)]


def test_dgx_h100_every_pair_nv18_through_nvswitch() -> None:
    assert inventory(fake_nvml.dgx_h100()) == {
        "version": 1,
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-h100000{i}-0000-4000-8000-00000000000{i}",
                "model": "NVIDIA-H100-80GB-HBM3",
                "memoryMiB": 81559,
                "numa": 0 if i < 4 else 1,
                "healthy": True,
                "migMode": False,
                "nvlinkRemoteBusIds": H100_SWITCH_PORTS,
            }
            for i in range(8)
        ],
        "nvlink": [
            [0, 18, 18, 18, 18, 18, 18, 18],
            [18, 0, 18, 18, 18, 18, 18, 18],
            [18, 18, 0, 18, 18, 18, 18, 18],
            [18, 18, 18, 0, 18, 18, 18, 18],
            [18, 18, 18, 18, 0, 18, 18, 18],
            [18, 18, 18, 18, 18, 0, 18, 18],
            [18, 18, 18, 18, 18, 18, 0, 18],
            [18, 18, 18, 18, 18, 18, 18, 0],
        ],
        "pcie": [
            ["X", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"],
            ["NODE", "X", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"],
            ["NODE", "NODE", "X", "NODE", "SYS", "SYS", "SYS", "SYS"],
            ["NODE", "NODE", "NODE", "X", "SYS", "SYS", "SYS", "SYS"],
            ["SYS", "SYS", "SYS", "SYS", "X", "NODE", "NODE", "NODE"],
            ["SYS", "SYS", "SYS", "SYS", "NODE", "X", "NODE", "NODE"],
            ["SYS", "SYS", "SYS", "SYS", "NODE", "NODE", "X", "NODE"],
            ["SYS", "SYS", "SYS", "SYS", "NODE", "NODE", "NODE", "X"],
        ],
    }


def test_dgx_a100_every_pair_nv12_and_numa_per_pair() -> None:
    assert inventory(fake_nvml.dgx_a100()) == {
        "version": 1,
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-a100000{i}-0000-4000-8000-00000000000{i}",
                "model": "NVIDIA-A100-SXM4-80GB",
                "memoryMiB": 81920,
                "numa": (3, 3, 1, 1, 7, 7, 5, 5)[i],
                "healthy": True,
                "migMode": False,
                "nvlinkRemoteBusIds": A100_SWITCH_PORTS,
            }
            for i in range(8)
        ],
        "nvlink": uniform(8, 12),
        "pcie": [
            ["X", "PXB", "SYS", "SYS", "SYS", "SYS", "SYS", "SYS"],
            ["PXB", "X", "SYS", "SYS", "SYS", "SYS", "SYS", "SYS"],
            ["SYS", "SYS", "X", "PXB", "SYS", "SYS", "SYS", "SYS"],
            ["SYS", "SYS", "PXB", "X", "SYS", "SYS", "SYS", "SYS"],
            ["SYS", "SYS", "SYS", "SYS", "X", "PXB", "SYS", "SYS"],
            ["SYS", "SYS", "SYS", "SYS", "PXB", "X", "SYS", "SYS"],
            ["SYS", "SYS", "SYS", "SYS", "SYS", "SYS", "X", "PXB"],
            ["SYS", "SYS", "SYS", "SYS", "SYS", "SYS", "PXB", "X"],
        ],
    }


BRIDGED_BUSES = ["0000:1a:00.0", "0000:1b:00.0", "0000:3d:00.0", "0000:3e:00.0",
                 "0000:88:00.0", "0000:89:00.0", "0000:b1:00.0", "0000:b2:00.0"]  # fmt: skip
BRIDGED_EXPECTED = {
    "version": 1,
    "gpus": [
        {
            "index": i,
            "uuid": f"GPU-a4000000-0000-4000-8000-00000000000{i}",
            "model": "NVIDIA-A40",
            "memoryMiB": 46068,
            "numa": 0 if i < 4 else 1,
            "healthy": True,
            "nvlinkRemoteBusIds": [BRIDGED_BUSES[i ^ 1]] * 4,
        }
        for i in range(8)
    ],
    "nvlink": [
        [0, 4, 0, 0, 0, 0, 0, 0],
        [4, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 4, 0, 0, 0, 0],
        [0, 0, 4, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 4, 0, 0],
        [0, 0, 0, 0, 4, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 4],
        [0, 0, 0, 0, 0, 0, 4, 0],
    ],
    "pcie": [
        ["X", "PIX", "PXB", "PXB", "SYS", "SYS", "SYS", "SYS"],
        ["PIX", "X", "PXB", "PXB", "SYS", "SYS", "SYS", "SYS"],
        ["PXB", "PXB", "X", "PIX", "SYS", "SYS", "SYS", "SYS"],
        ["PXB", "PXB", "PIX", "X", "SYS", "SYS", "SYS", "SYS"],
        ["SYS", "SYS", "SYS", "SYS", "X", "PIX", "PXB", "PXB"],
        ["SYS", "SYS", "SYS", "SYS", "PIX", "X", "PXB", "PXB"],
        ["SYS", "SYS", "SYS", "SYS", "PXB", "PXB", "X", "PIX"],
        ["SYS", "SYS", "SYS", "SYS", "PXB", "PXB", "PIX", "X"],
    ],
}


def test_pcie_server_with_nvlink_bridges_links_only_the_bridged_pairs() -> None:
    nvml = fake_nvml.pcie_server_bridged()
    assert inventory(nvml) == BRIDGED_EXPECTED
    # This driver has no nvmlDeviceGetNumaNodeId: the NUMA node came from the memory affinity mask.
    assert "nvmlDeviceGetMemoryAffinity" in nvml.calls


def test_pcie_server_read_by_bus_id_when_the_driver_cannot_name_the_remote_device() -> None:
    assert inventory(fake_nvml.pcie_server_bridged(remote_type_supported=False)) == BRIDGED_EXPECTED


def test_pcie_only_box_has_no_nvlink() -> None:
    assert inventory(fake_nvml.pcie_box()) == {
        "version": 1,
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-14000000-0000-4000-8000-00000000000{i}",
                "model": "NVIDIA-L4",
                "memoryMiB": 23034,
                "numa": 0,
                "healthy": True,
            }
            for i in range(4)
        ],
        "nvlink": uniform(4, 0),
        "pcie": [
            ["X", "PHB", "NODE", "NODE"],
            ["PHB", "X", "NODE", "NODE"],
            ["NODE", "NODE", "X", "PHB"],
            ["NODE", "NODE", "PHB", "X"],
        ],
    }


def test_bindings_older_than_the_newer_calls_still_discover_everything() -> None:
    nvml = fake_nvml.dgx_h100()
    nvml.nvmlDeviceGetNumaNodeId = None  # as if pynvml had no such attribute
    nvml.nvmlDeviceGetNvLinkRemoteDeviceType = None
    assert inventory(nvml) == inventory(fake_nvml.dgx_h100())
    assert "nvmlDeviceGetMemoryAffinity" in nvml.calls


def test_nvswitch_links_read_by_bus_id_count_as_switch_links() -> None:
    result = inventory(fake_nvml.dgx_h100(remote_type_supported=False))
    assert result["nvlink"] == uniform(8, 18)


def test_a_gpu_with_switch_links_down_gets_fewer_links_to_every_peer() -> None:
    nvml = fake_nvml.dgx_h100()
    degraded = {link: port for link, port in nvml.gpus[2].links.items() if link not in (0, 17)}
    result = inventory(with_gpu(nvml, 2, links=degraded))
    expected = uniform(8, 18)
    for j in range(8):
        if j != 2:
            expected[2][j] = expected[j][2] = 16
    assert result["nvlink"] == expected
    assert len(result["gpus"][2]["nvlinkRemoteBusIds"]) == 16


def test_direct_and_switch_links_add_up() -> None:
    nvml = fake_nvml.pcie_box()
    switch = fake_nvml.pcie_bus(0xE0)
    nvml.gpus[0] = fake_nvml.replace(nvml.gpus[0], link_slots=4, links={
        0: Link(GPU, nvml.gpus[1].bus_id), 1: Link(GPU, nvml.gpus[1].bus_id), 2: Link(SWITCH, switch),
    })  # fmt: skip
    nvml.gpus[1] = fake_nvml.replace(nvml.gpus[1], link_slots=4, links={
        0: Link(GPU, nvml.gpus[0].bus_id), 1: Link(GPU, nvml.gpus[0].bus_id), 2: Link(SWITCH, switch),
        3: Link(SWITCH, switch),
    })  # fmt: skip
    nvml.gpus[2] = fake_nvml.replace(nvml.gpus[2], link_slots=4, links={0: Link(SWITCH, switch)})
    assert inventory(nvml)["nvlink"] == [
        [0, 3, 1, 0],
        [3, 0, 1, 0],
        [1, 1, 0, 0],
        [0, 0, 0, 0],
    ]


def test_a_link_to_a_gpu_outside_this_node_view_is_not_counted() -> None:
    nvml = fake_nvml.pcie_box()
    nvml.gpus[0] = fake_nvml.replace(nvml.gpus[0], link_slots=2, links={0: Link(GPU, "00000000:77:00.0")})
    result = inventory(nvml)
    assert result["nvlink"] == uniform(4, 0)
    assert result["gpus"][0]["nvlinkRemoteBusIds"] == ["0000:77:00.0"]


def test_mig_enabled_is_reported() -> None:
    result = inventory(with_gpu(fake_nvml.dgx_a100(), 7, mig=1))
    assert [gpu["migMode"] for gpu in result["gpus"]] == [False] * 7 + [True]


@pytest.mark.parametrize(
    ("changes", "healthy"),
    [
        ({"remapped_rows": (3, 0, 0, 0)}, True),  # corrected rows remapped: nothing to do
        ({"remapped_rows": (0, 1, 1, 0)}, False),  # remapping pending: the card needs a reset
        ({"remapped_rows": (0, 1, 0, 1)}, False),  # remapping failed: the card needs replacing
        ({"remapped_rows": None, "retired_pending": 1}, False),  # pre-Ampere: pages waiting to retire
        ({"remapped_rows": None, "retired_pending": 0}, True),
        ({"lost": True}, False),
        ({"health_denied": True}, True),  # not allowed to ask is not a fault
        ({"health_denied": True, "remapped_rows": (0, 1, 1, 0)}, True),
    ],
)
def test_health(changes: dict, healthy: bool) -> None:
    result = inventory(with_gpu(fake_nvml.dgx_a100(), 3, **changes))
    assert [gpu["healthy"] for gpu in result["gpus"]] == [True, True, True, healthy, True, True, True, True]


def test_numa_minus_one_from_a_single_socket_machine_is_node_zero() -> None:
    nvml = fake_nvml.pcie_box()
    assert [gpu["numa"] for gpu in inventory(nvml)["gpus"]] == [0, 0, 0, 0]
    assert "nvmlDeviceGetMemoryAffinity" not in nvml.calls


def test_numa_from_memory_affinity_beyond_the_first_mask_word() -> None:
    nvml = with_gpu(fake_nvml.pcie_server_bridged(), 5, numa=70)
    assert [gpu["numa"] for gpu in inventory(nvml)["gpus"]] == [0, 0, 0, 0, 1, 70, 1, 1]


def test_pcie_level_nvml_cannot_place_is_taken_as_sys() -> None:
    nvml = fake_nvml.pcie_box()
    del nvml.levels[(0, 1)]
    nvml.levels[(2, 3)] = fake_nvml.INTERNAL  # two GPUs on one board
    assert inventory(nvml)["pcie"] == [
        ["X", "SYS", "NODE", "NODE"],
        ["SYS", "X", "NODE", "NODE"],
        ["NODE", "NODE", "X", "PIX"],
        ["NODE", "NODE", "PIX", "X"],
    ]


def test_no_gpus_gives_an_empty_inventory() -> None:
    assert inventory(fake_nvml.FakeNvml([], {})) == {"version": 1, "gpus": [], "nvlink": [], "pcie": []}


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("Tesla V100-SXM2-32GB", "Tesla-V100-SXM2-32GB"),
        (" NVIDIA  GeForce RTX 4090 ", "NVIDIA-GeForce-RTX-4090"),
    ],
)
def test_model_names_in_gpu_feature_discovery_spelling(name: str, label: str) -> None:
    assert gfd_model_name(name) == label


@pytest.mark.parametrize(
    ("bus_id", "normal"),
    [
        ("00000000:1B:00.0", "0000:1b:00.0"),
        ("0000:1b:00.0", "0000:1b:00.0"),
        ("00000001:C4:00.1", "0001:c4:00.1"),
        ("1B:00.0", "0000:1b:00.0"),
        ("not-a-bus", "not-a-bus"),
    ],
)
def test_bus_ids_have_one_spelling(bus_id: str, normal: str) -> None:
    assert normalise_bus_id(bus_id) == normal


MACHINES = [fake_nvml.dgx_h100, fake_nvml.dgx_a100, fake_nvml.pcie_server_bridged, fake_nvml.pcie_box]


@pytest.fixture(scope="module")
def crd_schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.__name__)
def test_every_machine_inventory_fits_the_crd_schema_and_the_format(machine, crd_schema: dict) -> None:
    from webhook.agent.publish import inventory_object, inventory_status

    spec = inventory(machine())
    obj = json.loads(json.dumps(inventory_object("gpu-node-1", spec, inventory_status(spec, "550.90.07"))))
    jsonschema.validate(obj, crd_schema)
    gpus, nvlink, pcie = inventory_from_json(obj["spec"])
    assert [gpu.uuid for gpu in gpus] == [gpu["uuid"] for gpu in spec["gpus"]]
    assert len(nvlink) == len(pcie) == len(gpus)


def test_the_crd_schema_rejects_an_unknown_pcie_level(crd_schema: dict) -> None:
    spec = inventory(fake_nvml.pcie_box())
    spec["pcie"][0][1] = "NV4"
    with pytest.raises(jsonschema.ValidationError, match="'NV4' is not one of"):
        jsonschema.validate({"spec": spec}, crd_schema)
