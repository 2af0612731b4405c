"""The GPUInventory CRD: a valid apiextensions object, in step with the inventory format the code checks."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from webhook.agent.publish import KIND, PLURAL, VERSION
from webhook.core.domain.names import GROUP
from webhook.core.podspec.inventory import (
    OPTIONAL_GPU_FIELDS,
    OPTIONAL_TOP_LEVEL_FIELDS,
    PCIE_LEVELS,
    REQUIRED_GPU_FIELDS,
    TOOLKIT_FIELDS,
    TOP_LEVEL_FIELDS,
)

CRD_PATH = Path(__file__).resolve().parents[2] / "charts" / "gpu-admission" / "crds" / "gpuinventory.yaml"


@pytest.fixture(scope="module")
def crd() -> dict:
    documents = list(yaml.safe_load_all(CRD_PATH.read_text()))
    assert len(documents) == 1
    return documents[0]


def test_crd_is_a_valid_custom_resource_definition(crd: dict) -> None:
    kubernetes_validate.validate(crd, "1.30.0", strict=True)


def test_names_scope_and_version(crd: dict) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}" == "gpuinventories.gpu-admission.io"
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"], spec["scope"]) == (
        GROUP,
        KIND,
        PLURAL,
        "Cluster",
    )
    assert [(v["name"], v["served"], v["storage"]) for v in spec["versions"]] == [(VERSION, True, True)]
    assert "subresources" not in spec["versions"][0]  # the agent writes spec and status in one request


def test_printer_columns(crd: dict) -> None:
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [(c["name"], c["jsonPath"]) for c in columns] == [
        ("GPUs", ".status.gpuCount"),
        ("Model", ".status.model"),
        ("NVLink", ".status.nvlink"),
        ("Driver", ".status.driverVersion"),
        ("EnvRoute", ".status.visibleDevicesEnvvar"),
        ("Age", ".metadata.creationTimestamp"),
    ]


def test_schema_matches_the_inventory_format(crd: dict) -> None:
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == list(TOP_LEVEL_FIELDS)
    assert sorted(spec["properties"]) == sorted(TOP_LEVEL_FIELDS + OPTIONAL_TOP_LEVEL_FIELDS)
    assert sorted(spec["properties"]["toolkit"]["properties"]) == sorted(TOOLKIT_FIELDS)
    gpu = spec["properties"]["gpus"]["items"]
    assert gpu["required"] == list(REQUIRED_GPU_FIELDS)
    assert list(gpu["properties"]) == list(REQUIRED_GPU_FIELDS + OPTIONAL_GPU_FIELDS)
    assert spec["properties"]["pcie"]["items"]["items"]["enum"] == list(PCIE_LEVELS)
    assert spec["properties"]["version"]["enum"] == [1]
