"""The policy file: defaults as documented, every error naming its field, entry-point scorers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from webhook.core.domain.model import TopologyClass
from webhook.core.domain.request import TopologyPreference
from webhook.core.policy.model import NamespaceRule, Policy, PolicyError, parse_policy
from webhook.errors import UserError
from webhook.policyfile.read import load_policy

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_policy() -> dict:
    text = README.read_text().split("## The policy file", 1)[1]
    return yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])


def test_the_readme_defaults_are_the_defaults() -> None:
    documented = readme_policy()
    documented.pop("namespaces")
    assert parse_policy(documented) == Policy()


def test_readme_example_namespace_rule() -> None:
    policy = parse_policy(readme_policy())
    assert policy.rule("team-a") == NamespaceRule(8, ("H100", "A100"), True, "spread", "mps")
    assert policy.placement_for("team-a") == "spread" and policy.placement_for("other") == "binpack"
    assert policy.backend_for("team-a") == "mps" and policy.backend_for("other") == "hami-core"


def test_full_policy_parses() -> None:
    policy = parse_policy(
        {
            "defaults": {
                "placement": {"fragmentation": 2, "binpack": 1},
                "topology": "required",
                "memoryPercent": 50,
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
            },
            "topologyLoss": {"mixed": 0.1},
            "whenFull": "deny",
            "stale": {"afterSeconds": 30, "action": "allow"},
            "workloadMix": [{"gpus": 1, "milli": 500, "weight": 3}],
        }
    )
    assert policy.placement == {"fragmentation": 2.0, "binpack": 1.0}
    assert policy.topology is TopologyPreference.REQUIRED and policy.memory_percent == 50
    assert policy.topology_loss[TopologyClass.MIXED] == 0.1
    assert (policy.when_full, policy.stale_after_seconds, policy.on_stale) == ("deny", 30.0, "allow")
    assert policy.workload_mix[0].milli == 500


@pytest.mark.parametrize(
    ("data", "field", "text"),
    [
        ({"defaults": {"placement": "densest"}}, "defaults.placement", "expected one of random, best-fit"),
        ({"defaults": {"placement": {"binpack": -1}}}, "defaults.placement.binpack", "expected a number >= 0.0"),
        ({"defaults": {"placement": {"binpack": 0}}}, "defaults.placement", "at least one weight"),
        ({"defaults": {"backend": "cuda"}}, "defaults.backend", "expected one of hami-core, mps, none"),
        ({"defaults": {"memoryPercent": 0}}, "defaults.memoryPercent", "expected an integer 1..100"),
        ({"defaults": {"tolerations": [{"operator": "Maybe"}]}}, "defaults.tolerations[0].operator", "Exists"),
        ({"defaults": {"colour": 1}}, "defaults.colour", "unknown field"),
        ({"surprise": 1}, "surprise", "unknown field"),
        ({"topologyLoss": {"nvlink": 0.5, "pcie": 0.1}}, "topologyLoss", "nvlink <= mixed <= pcie"),
        ({"namespaces": {"team-a": {"maxGpusPerPod": -1}}}, "namespaces.team-a.maxGpusPerPod", "integer >= 0"),
        ({"namespaces": {"team-a": {"allowSharing": "yes"}}}, "namespaces.team-a.allowSharing", "true or false"),
        ({"namespaces": {"team-a": {"allowedModels": "H100"}}}, "namespaces.team-a.allowedModels", "list"),
        ({"workloadMix": [{"gpus": 0}]}, "workloadMix[0].gpus", "1..64"),
        ({"stale": {"action": "panic"}}, "stale.action", "deny, allow"),
        ([1, 2], "(top level)", "expected a mapping"),
    ],
)
def test_errors_name_the_field(data, field, text) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(data)
    assert caught.value.field == field
    assert text in str(caught.value)


def test_custom_scorer_names_become_valid_placements() -> None:
    def score(request, node, usage, option) -> float:
        return 1.0

    policy = parse_policy({"defaults": {"placement": {"mine": 1, "binpack": 1}}}, {"mine": score})
    assert policy.scorers == {"mine": score}
    with pytest.raises(PolicyError):
        parse_policy({"defaults": {"placement": "mine"}})


def test_load_policy_names_file_document_and_field(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("namespaces:\n  team-a:\n    maxGpusPerPod: -1\n")
    with pytest.raises(UserError) as caught:
        load_policy(path, scorers={})
    assert str(caught.value) == (
        f"{path}: document 0: field namespaces.team-a.maxGpusPerPod: expected an integer >= 0, got -1"
    )


def test_load_policy_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("defaults: [1,\n")
    with pytest.raises(UserError, match=r"policy.yaml: document 0: invalid YAML \(line 2"):
        load_policy(path, scorers={})
    with pytest.raises(UserError, match="cannot read policy file"):
        load_policy(tmp_path / "missing.yaml", scorers={})


def test_no_file_means_defaults() -> None:
    assert load_policy(None, scorers={}) == Policy()
