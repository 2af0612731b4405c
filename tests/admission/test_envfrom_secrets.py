"""A Secret (or a ConfigMap the webhook cannot see) taken through envFrom by a container that has GPUs.

The kubelet puts the pod's own variables after the device plugin's and, within them, envFrom before env:
so a Secret can replace NVIDIA_VISIBLE_DEVICES (no env entry can pin it in a GPU container), while an
explicit env entry wins over anything the Secret sets. Under `neutralise` (the default) the switches of
the limit layer are pinned, and the pod is admitted only where every GPU node ignores the device
variable in unprivileged containers.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from builders import H100, node, pod, snapshot

from webhook.core.admission import admit
from webhook.core.admission.env_pins import can_form, harmless, pins_for
from webhook.core.admission.envfrom import env_from_keys
from webhook.core.admission.ephemeral import ephemeral
from webhook.core.domain.model import Node, Snapshot
from webhook.core.podspec.limits import ENV_FROM_PINS, ISOLATION_ENV
from webhook.core.policy.model import Policy, PolicyError, parse_policy

CLAIMS = Path(__file__).parent.parent / "fixtures" / "dra" / "claims.yaml"

CONFIG_MAPS = {"team-a": {"settings": env_from_keys({"LOG_LEVEL": "info", "MODEL": "llama"})}}
OPEN = dataclasses.replace(snapshot(node("h1", H100, 8), node("h2", H100, 8), Node("cpu-1")),
                           config_maps=CONFIG_MAPS)
CLOSED = dataclasses.replace(OPEN, nodes={n: dataclasses.replace(v, toolkit_envvar=False) if v.gpus else v
                                          for n, v in OPEN.nodes.items()})
SECRET = {"secretRef": {"name": "hf-token"}}
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def gpu_pod(*sources: dict[str, Any], limits: dict[str, Any] | None = None) -> dict[str, Any]:
    p = pod(limits or {"nvidia.com/gpu": 1})
    if sources:
        p["spec"]["containers"][0]["envFrom"] = list(sources)
    return p


def chain(p: dict[str, Any], snap: Snapshot, policy: Policy | None = None) -> tuple[Any, dict[str, Any], Any]:
    policy = policy or Policy()
    mutated = admit.mutate(p, snap, policy)
    assert mutated.allowed, mutated.message
    final = jsonpatch.apply_patch(p, [dict(op) for op in mutated.patch])
    return mutated, final, admit.validate(final, snap, policy)


def env_of(p: dict[str, Any], index: int = 0, key: str = "containers") -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in p["spec"][key][index].get("env", [])}


def test_a_secret_in_a_gpu_container_is_refused_where_nodes_honour_the_device_variable() -> None:
    decision = admit.mutate(gpu_pod(SECRET), OPEN, Policy())
    assert (decision.allowed, decision.code, decision.reason) == (False, 403, "isolation-env-from")
    for hint in ("Secret 'hf-token'", "NVIDIA_VISIBLE_DEVICES", "prefix", "secretKeyRef",
                 "accept-nvidia-visible-devices-envvar-when-unprivileged = false"):
        assert hint in decision.message
    assert not admit.validate(gpu_pod(SECRET), OPEN, Policy()).allowed
    # One node of unknown toolkit setting is enough to refuse: the pod could land there.
    mixed = dataclasses.replace(CLOSED, nodes={**CLOSED.nodes, "h2": OPEN.nodes["h2"]})
    assert admit.mutate(gpu_pod(SECRET), mixed, Policy()).reason == "isolation-env-from"


def test_admitted_with_pins_when_every_gpu_node_ignores_the_variable() -> None:
    mutated, final, validated = chain(gpu_pod(SECRET), CLOSED)
    assert validated.allowed, validated.message
    env = env_of(final)
    assert {k: env[k] for k in ENV_FROM_PINS} == ENV_FROM_PINS
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "81559m" and "NVIDIA_VISIBLE_DEVICES" not in env
    assert any("pinned" in w for w in mutated.warnings)
    assert final["spec"]["containers"][0]["envFrom"] == [SECRET]


def test_a_prefix_no_isolation_variable_starts_with_makes_the_source_harmless() -> None:
    plain, _, _ = chain(gpu_pod(), OPEN)
    with_app, final, validated = chain(gpu_pod({**SECRET, "prefix": "APP_"}), OPEN)
    assert validated.allowed and with_app.warnings == ()
    assert with_app.patch == plain.patch  # no pin, nothing but what any GPU pod gets
    assert harmless("APP_") and harmless("HF_") and not harmless("") and not harmless("C")


@pytest.mark.parametrize("prefix", ["NVIDIA_", "NVIDIA_VISIBLE_", "N", ""])
def test_a_prefix_that_can_form_the_device_variable_is_still_refused(prefix: str) -> None:
    decision = admit.mutate(gpu_pod({**SECRET, "prefix": prefix}), OPEN, Policy())
    assert (decision.allowed, decision.reason) == (False, "isolation-env-from")


def test_a_prefix_that_forms_only_limit_switches_is_pinned_even_on_open_nodes() -> None:
    mutated, final, validated = chain(gpu_pod({**SECRET, "prefix": "CUDA_"}), OPEN)
    assert validated.allowed, validated.message
    env = env_of(final)
    assert {"CUDA_TASK_PRIORITY", "CUDA_REDIRECT", "CUDA_OVERSUBSCRIBE", "CUDA_DISABLE_CONTROL",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE"} <= env.keys()
    assert not {"ACTIVE_OOM_KILLER", "GPU_CORE_UTILIZATION_POLICY", "LD_PRELOAD", "NVIDIA_GDS"} & env.keys()


def test_config_maps_the_webhook_reads_stay_admitted_unchanged() -> None:
    plain, _, _ = chain(gpu_pod(), OPEN)
    decision, _, validated = chain(gpu_pod({"configMapRef": {"name": "settings"}}), OPEN)
    assert validated.allowed and decision.warnings == () and decision.patch == plain.patch
    # One the cache has not seen is as unreadable as a Secret.
    unseen = admit.mutate(gpu_pod({"configMapRef": {"name": "not-seen"}}), OPEN, Policy())
    assert (unseen.allowed, unseen.reason) == (False, "isolation-env-from") and "ConfigMap 'not-seen'" in unseen.message


def test_warn_keeps_admitting_with_a_warning_and_no_pins() -> None:
    policy = parse_policy({"isolation": {"unresolvedEnvFrom": "warn"}})
    plain, _, _ = chain(gpu_pod(), OPEN, policy)
    decision, _, validated = chain(gpu_pod(SECRET), OPEN, policy)
    assert validated.allowed and decision.patch == plain.patch
    assert any("Secret 'hf-token'" in w and len(w) < 120 for w in decision.warnings)
    deny = parse_policy({"isolation": {"unresolvedEnvFrom": "deny"}})
    assert admit.mutate(gpu_pod(SECRET), CLOSED, deny).reason == "isolation-env-from"
    assert admit.mutate(gpu_pod({**SECRET, "prefix": "APP_"}), OPEN, deny).allowed


def test_policy_errors_name_the_field() -> None:
    with pytest.raises(PolicyError, match=r"isolation\.unresolvedEnvFrom.*neutralise, deny, warn"):
        parse_policy({"isolation": {"unresolvedEnvFrom": "allow"}})
    with pytest.raises(PolicyError, match=r"isolation\.nonGpuAccess"):
        parse_policy({"isolation": {"nonGpuAccess": "warn"}})


def debug(target: dict[str, Any], container: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    old = copy.deepcopy(target)
    old["spec"]["nodeName"] = "h1"
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [container]
    return new, old


def test_an_ephemeral_container_taking_a_secret_gets_void_and_deny_refuses_it() -> None:
    _, final, _ = chain(gpu_pod(), OPEN)
    new, old = debug(final, {"name": "dbg", "image": "busybox", "envFrom": [SECRET]})
    mutated = ephemeral(new, old, OPEN, Policy(), mutating=True)
    assert mutated.allowed and [op["value"] for op in mutated.patch] == [[VOID]]
    patched = jsonpatch.apply_patch(new, [dict(op) for op in mutated.patch])
    assert ephemeral(patched, old, OPEN, Policy(), mutating=False).allowed
    assert not ephemeral(new, old, OPEN, Policy(), mutating=False).allowed  # without the void: refused
    deny = parse_policy({"isolation": {"unresolvedEnvFrom": "deny"}})
    refused = ephemeral(new, old, OPEN, deny, mutating=True)
    assert (refused.allowed, refused.reason) == (False, "isolation-env-from")
    prefixed, _ = debug(final, {"name": "dbg", "image": "busybox", "envFrom": [{**SECRET, "prefix": "APP_"}]})
    assert ephemeral(prefixed, old, OPEN, deny, mutating=True).allowed


def test_an_init_container_with_gpus_is_held_to_the_same_rule() -> None:
    p = gpu_pod()
    p["spec"]["initContainers"] = [{"name": "warmup", "image": "cuda", "envFrom": [SECRET],
                                    "resources": {"limits": {"nvidia.com/gpu": 1}}}]
    assert admit.mutate(p, OPEN, Policy()).reason == "isolation-env-from"
    _, final, validated = chain(p, CLOSED)
    assert validated.allowed and env_of(final, 0, "initContainers")["ACTIVE_OOM_KILLER"] == "true"
    assert "ACTIVE_OOM_KILLER" not in env_of(final)  # the app container takes no Secret


def test_pins_are_written_once_and_a_second_pass_adds_nothing() -> None:
    slice_limits = {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30}
    p = gpu_pod(SECRET, limits=slice_limits)
    mutated, final, validated = chain(p, CLOSED)
    assert validated.allowed, validated.message
    env = env_of(final)
    # HAMi-core reads a per-device compute limit before the shared one: both devices pinned to the cap.
    assert (env["CUDA_DEVICE_SM_LIMIT"], env["CUDA_DEVICE_SM_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_1"]) == ("30",) * 3
    assert [e["name"] for e in final["spec"]["containers"][0]["env"]].count("ACTIVE_OOM_KILLER") == 1
    again = admit.mutate(final, CLOSED, Policy())
    assert again.allowed and again.patch == ()
    # A per-device limit other than the cap is a lifted limit.
    lifted = copy.deepcopy(final)
    for e in lifted["spec"]["containers"][0]["env"]:
        if e["name"] == "CUDA_DEVICE_SM_LIMIT_0":
            e["value"] = "100"
    refused = admit.validate(lifted, CLOSED, Policy())
    assert (refused.allowed, refused.reason) == (False, "isolation-env")


def test_validation_refuses_a_pod_whose_pins_were_removed() -> None:
    _, final, _ = chain(gpu_pod(SECRET), CLOSED)
    for name in ("ACTIVE_OOM_KILLER", "LD_PRELOAD", "NVIDIA_GDS"):
        stripped = copy.deepcopy(final)
        env = stripped["spec"]["containers"][0]["env"]
        stripped["spec"]["containers"][0]["env"] = [e for e in env if e["name"] != name]
        decision = admit.validate(stripped, CLOSED, Policy())
        assert (decision.allowed, decision.code, decision.reason) == (False, 403, "limits-missing"), name
        assert name in decision.message


def test_an_empty_pin_stored_without_its_value_still_counts() -> None:
    # The API server drops `value: ""` (omitempty); the kubelet then sets the variable to "".
    _, final, _ = chain(gpu_pod(SECRET), CLOSED)
    stored = copy.deepcopy(final)
    for e in stored["spec"]["containers"][0]["env"]:
        if e.get("value") == "":
            del e["value"]
    assert admit.validate(stored, CLOSED, Policy()).allowed
    assert admit.mutate(stored, CLOSED, Policy()).patch == ()


def test_a_user_may_not_set_a_pinned_variable_to_anything_but_its_safe_value() -> None:
    p = gpu_pod(SECRET)
    p["spec"]["containers"][0]["env"] = [{"name": "ACTIVE_OOM_KILLER", "value": "false"}]
    assert admit.mutate(p, CLOSED, Policy()).reason == "isolation-env"
    p["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "/evil.so"}]
    assert admit.mutate(p, CLOSED, Policy()).reason == "isolation-env"


def test_every_pin_is_an_isolation_variable_and_a_prefix_forms_only_its_own() -> None:
    assert set(ENV_FROM_PINS) <= set(ISOLATION_ENV)
    assert can_form("", "LD_PRELOAD") and not can_form("LD_PRELOAD", "LD_PRELOAD")
    assert dict(pins_for(["NVIDIA_"], 1, 100, "hami-core")) == {
        n: v for n, v in ENV_FROM_PINS.items() if n.startswith("NVIDIA_")}
    assert ("CUDA_DEVICE_SM_LIMIT_0", "40") in pins_for([""], 1, 40, "hami-core")
    assert not any(n.startswith("CUDA_DEVICE_SM_LIMIT_") for n, _ in pins_for([""], 1, 40, "mps"))


def test_a_container_with_gpus_from_a_dra_claim_is_held_to_the_same_rule() -> None:
    import yaml

    from webhook.core.admission import dra

    docs = [d for d in yaml.safe_load_all(CLAIMS.read_text())
            if d]
    templates = {f"team-a/{d['metadata']['name']}": dra.read_claim(d) for d in docs
                 if d["kind"] == "ResourceClaimTemplate"}
    p = pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "gpu-claim-template"}])
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    p["spec"]["containers"][0]["envFrom"] = [SECRET]
    refused = admit.mutate(p, dataclasses.replace(OPEN, claim_templates=templates), Policy())
    assert (refused.allowed, refused.reason) == (False, "isolation-env-from")
    _, final, validated = chain(p, dataclasses.replace(CLOSED, claim_templates=templates))
    assert validated.allowed and env_of(final)["ACTIVE_OOM_KILLER"] == "true"
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(final)  # its GPUs come through CDI: no void either


def test_only_the_nodes_the_pod_can_land_on_need_to_ignore_the_variable() -> None:
    from builders import A100

    closed_h100 = dataclasses.replace(node("h1", H100, 8), toolkit_envvar=False)
    snap = dataclasses.replace(snapshot(closed_h100, node("a1", A100, 8)), config_maps=CONFIG_MAPS)
    assert admit.mutate(gpu_pod(SECRET), snap, Policy()).reason == "isolation-env-from"  # could go to a1
    pinned = gpu_pod(SECRET)
    pinned["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": H100[0]}
    _, final, validated = chain(pinned, snap)
    assert validated.allowed and env_of(final)["ACTIVE_OOM_KILLER"] == "true"
    # A cordoned node of the selection still counts: the cordon may be lifted while the pod waits.
    cordoned = dataclasses.replace(node("h2", H100, 8), unschedulable=True)
    snap2 = dataclasses.replace(snap, nodes={**snap.nodes, "h2": cordoned})
    assert admit.mutate(pinned, snap2, Policy()).reason == "isolation-env-from"


def test_the_shared_cache_pin_keeps_the_container_where_hami_watches_it() -> None:
    # HAMi's device plugin mounts the node's vgpu/containers/<pod uid>_<container> at /usr/local/vgpu and its
    # monitor reads the one *.cache file there (skipping names with libvgpu.so); a pod env entry wins over
    # the plugin's own value, so the pin must name a file in that directory, never a private one.
    _, final, validated = chain(gpu_pod({**SECRET, "prefix": "CUDA_"}), OPEN)
    assert validated.allowed, validated.message
    pinned = env_of(final)["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    directory, _, name = pinned.rpartition("/")
    assert directory == "/usr/local/vgpu" and name.endswith(".cache") and "libvgpu.so" not in name


@pytest.mark.parametrize("value", ["/tmp/cudevshr.cache", "/tmp/mine.cache", "/usr/local/vgpu/../x.cache",
                                   "/usr/local/vgpu/other.cache"])
def test_a_shared_cache_the_pod_chooses_is_refused_unless_it_is_the_pin(value: str) -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "value": value}]
    decision = admit.mutate(pod, OPEN, Policy())
    assert not decision.allowed and "CUDA_DEVICE_MEMORY_SHARED_CACHE" in decision.message
