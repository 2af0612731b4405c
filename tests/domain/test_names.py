"""The product's names in the code (webhook/core/domain/names.py) and in the Helm chart agree."""

from __future__ import annotations

from pathlib import Path

import yaml

from webhook.core.admission.updates import SCHEDULING_ANNOTATIONS
from webhook.core.domain import names

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpu-admission"


def test_the_inventory_crd_is_the_one_the_code_watches_and_publishes() -> None:
    crd = yaml.safe_load((CHART / "crds" / "gpuinventory.yaml").read_text())
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{names.INVENTORY_PLURAL}.{names.GROUP}"
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"]) == (
        names.GROUP, names.INVENTORY_KIND, names.INVENTORY_PLURAL)
    assert names.INVENTORY_VERSION in [v["name"] for v in spec["versions"]]


def test_the_opt_in_label_is_the_one_the_code_reads() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["namespaceSelection"]["label"] == names.ENABLED_LABEL


def test_the_record_webhook_guards_the_annotation_the_code_writes() -> None:
    webhooks = (CHART / "templates" / "webhooks.yaml").read_text()
    # The records webhook's matchConditions list the record and every annotation read at scheduling
    # (core/admission/updates.py): an UPDATE changing one of them must reach the webhook.
    condition = webhooks.split("name: may-reach-gpu", 1)[1].split("].exists(k,", 1)[0]
    listed = {word.strip().strip("'") for word in condition.split("[", 1)[1].replace("\n", " ").split(",")}
    assert listed == {names.ALLOCATION, *SCHEDULING_ANNOTATIONS}
    assert "k in object.metadata.annotations" in webhooks
    assert f"apiGroups: [\"{names.GROUP}\"]" in webhooks
    rbac = (CHART / "templates" / "rbac.yaml").read_text()
    assert f"apiGroups: [\"{names.GROUP}\"]" in rbac and names.INVENTORY_PLURAL in rbac
