"""An admission's work grows with the pod and the ConfigMaps it names, never with their product nor with the
square of its containers, env entries, envFrom entries, volumes, tolerations or affinity terms. Work is
counted (ConfigMap key look-ups through a counting key set; every function call while a pod is decided),
never timed; benchmarks/large_pods.py measures the time."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jsonpatch
import pytest
from builders import H100, node, snapshot

from webhook.core.admission import admit
from webhook.core.admission.envfrom import env_from, refused_keys
from webhook.core.domain.model import Snapshot
from webhook.core.podspec.limits import GPU_POD_ONLY_ENV, ISOLATION_ENV, ISOLATION_PREFIXES, is_isolation_env
from webhook.core.policy.model import Policy

NS = "team-a"


class CountingKeys(frozenset[str]):
    """A ConfigMap's key set (as the snapshot keeps it) that counts each key it is asked for or yields."""

    looked = 0

    def __contains__(self, key: object) -> bool:
        CountingKeys.looked += 1
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:
        for key in super().__iter__():
            CountingKeys.looked += 1
            yield key


def cluster(keys: frozenset[str]) -> Snapshot:
    return dataclasses.replace(snapshot(node("h1", H100, 8)), config_maps={NS: {"settings": keys}})


def pod(spec: dict[str, Any], name: str = "big") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": spec}


def gpu() -> dict[str, Any]:
    return {"limits": {"nvidia.com/gpu": "1"}}


def envfrom_pod(containers: int, prefixes: list[str]) -> dict[str, Any]:
    entries = [{"configMapRef": {"name": "settings"}, "prefix": p} for p in prefixes]
    items = [{"name": f"c{i}", "image": "x", "envFrom": copy.deepcopy(entries)} for i in range(containers)]
    items[0]["resources"] = gpu()
    return pod({"containers": items})


def admitted(p: dict[str, Any], cluster_: Snapshot) -> str:
    """Mutate, apply the patch, validate: the final answer's reason."""
    m = admit.mutate(p, cluster_, Policy())
    if not m.allowed:
        return m.reason
    final = jsonpatch.apply_patch(p, [dict(op) for op in m.patch])
    return admit.validate(final, cluster_, Policy()).reason


def key_lookups(containers: int, keys: int, prefixes: list[str]) -> tuple[int, str]:
    CountingKeys.looked = 0
    reason = admitted(envfrom_pod(containers, prefixes), cluster(CountingKeys(f"_k{i}" for i in range(keys))))
    return CountingKeys.looked, reason


PREFIXES = [f"APP{j}_" for j in range(10)] + ["CUDA_DEVICE", "CUDA_MPS", "", "NVIDIA_"]


def test_configmap_keys_are_looked_up_per_entry_not_per_key() -> None:
    """10 envFrom prefixes of one ConfigMap of harmless keys in each container (the reported pod): the
    key look-ups grow with the ConfigMap once (its keys sorted once) and with the entries by a constant
    each, never as entries x keys."""
    small, reason = key_lookups(20, 1000, PREFIXES)
    assert reason == "isolation-env"  # CUDA_DEVICE + _k<i>: every key is one
    more_keys, _ = key_lookups(20, 2000, PREFIXES)
    more_containers, _ = key_lookups(40, 1000, PREFIXES)
    assert more_keys - small <= 1000 * 4  # the extra keys read a few times in all, not once per entry
    assert more_containers <= small + 10  # the same (ConfigMap, prefix) answers every container
    harmless, reason = key_lookups(20, 1000, PREFIXES[:10])
    assert reason == "admitted" and harmless <= 20 * 10 * 40  # a few look-ups per entry, whatever the keys


def test_an_allowed_pod_reads_no_key_twice_per_entry() -> None:
    counts = [key_lookups(n, 4000, PREFIXES[:10])[0] for n in (10, 20, 40)]
    assert counts[1] - counts[0] == pytest.approx(counts[2] - counts[1], rel=0.05, abs=8)  # linear in entries
    assert counts[2] < 40 * 10 * 40  # not 40 x 10 x 4,000


@pytest.mark.parametrize(("prefix", "key", "variable"), [
    ("NVIDIA_", "VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"),
    ("CUDA_", "DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT"),
    ("", "LD_PRELOAD", "LD_PRELOAD"),
    ("LD_", "PRELOAD", "LD_PRELOAD"),
    ("CUDA_DEVI", "CE_SM_LIMIT_3", "CUDA_DEVICE_SM_LIMIT_3"),
    ("CUDA", "_MPS_PIPE_DIRECTORY", "CUDA_MPS_PIPE_DIRECTORY"),
])
def test_a_variable_hidden_behind_a_prefix_in_a_big_configmap_is_still_refused(prefix: str, key: str,
                                                                                variable: str) -> None:
    keys = frozenset({*(f"_k{i}" for i in range(5000)), *(f"PORT_{i}" for i in range(2000)), key})
    harmless = [f"APP{j}_" for j in range(8)]
    p = envfrom_pod(30, harmless)
    p["spec"]["containers"][17]["envFrom"].append({"configMapRef": {"name": "settings"}, "prefix": prefix})
    m = admit.mutate(p, cluster(keys), Policy())
    assert (m.allowed, m.code, m.reason) == (False, 403, "isolation-env")
    assert f"container 'c17' takes {variable} from ConfigMap 'settings'" in m.message


def test_an_entry_names_a_few_variables_and_counts_the_rest() -> None:
    keys = frozenset(f"E_k{i}" for i in range(300))
    p = envfrom_pod(2, ["CUDA_DEVIC"])
    violations, _ = env_from(p["spec"], NS, cluster(keys), gpu_pod=True)
    assert len(violations) == 2 * 6
    assert violations[5].message == ("container 'c0' takes 295 more such variables from ConfigMap 'settings' "
                                     "through envFrom; remove those keys")
    m = admit.mutate(p, cluster(keys), Policy())
    assert (m.allowed, m.reason) == (False, "isolation-env") and m.message.endswith("; and 7 more")


def brute(prefix: str, keys: frozenset[str], gpu_pod: bool) -> list[tuple[str, str]]:
    """The rule by its definition: every key tried."""
    found = sorted((prefix + k, k) for k in keys
                   if is_isolation_env(prefix + k) and (prefix + k not in GPU_POD_ONLY_ENV or gpu_pod))
    return [(k, v) for v, k in found]


def test_the_lookup_finds_exactly_what_trying_every_key_finds() -> None:
    names = [*ISOLATION_ENV, *ISOLATION_PREFIXES, "CUDA_DEVICE_ORDER", "CUDA_DEVICE_MAX_CONNECTIONS", "APP_X"]
    cuts = {name[:i] for name in names for i in range(len(name) + 1)}
    keys = frozenset({name[i:] + tail for name in names for i in range(len(name) + 1) for tail in ("", "0", "_X")}
                     - {""})
    for prefix, gpu_pod in itertools.product(sorted(cuts | {"APP_", "X"}), (True, False)):
        assert refused_keys(prefix, keys, gpu_pod) == brute(prefix, keys, gpu_pod), prefix


# -- every function call while a pod is decided ------------------------------------------------------------


def calls(run: Callable[[], Any]) -> int:
    count = 0

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return count


def init_containers(n: int) -> dict[str, Any]:
    inits = [{"name": f"i{i}", "image": "x", "env": [{"name": "STEP", "value": str(i)}],
              "volumeMounts": [{"name": f"v{i}", "mountPath": "/data"}]} for i in range(n)]
    return {"containers": [{"name": "main", "image": "cuda", "resources": gpu()}], "initContainers": inits,
            "volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(n)]}


def containers(n: int) -> dict[str, Any]:
    items = [{"name": f"c{i}", "image": "x", "env": [{"name": "A", "value": "1"}],
              "envFrom": [{"secretRef": {"name": "s"}, "prefix": "CUDA_"}],
              "resources": gpu() if i % 50 == 0 else {}} for i in range(n)]
    return {"containers": items}


def env_entries(n: int) -> dict[str, Any]:
    main = {"name": "main", "image": "cuda", "resources": gpu(),
            "env": [{"name": f"VAR_{i}", "value": str(i)} for i in range(n)]}
    return {"containers": [main]}


def scheduling(n: int) -> dict[str, Any]:
    main = {"name": "main", "image": "cuda", "resources": gpu(),
            "volumeMounts": [{"name": f"v{i}", "mountPath": f"/v{i}"} for i in range(n)]}
    terms = [{"matchExpressions": [{"key": f"k{t}", "operator": "NotIn", "values": ["a"]}]} for t in range(n // 4)]
    return {"containers": [main], "volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(n)],
            "tolerations": [{"key": f"t{i}", "operator": "Exists"} for i in range(n)],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": terms}}}}


@pytest.mark.parametrize(("make", "n"), [(init_containers, 400), (containers, 400), (env_entries, 1500),
                                         (scheduling, 400)])
def test_twice_the_pod_is_about_twice_the_work(make: Callable[[int], dict[str, Any]], n: int) -> None:
    cluster_ = snapshot(node("h1", H100, 8))
    assert admitted(pod(make(n), "warm"), cluster_) == "admitted"
    small = calls(lambda: admitted(pod(make(n)), cluster_))
    large = calls(lambda: admitted(pod(make(2 * n)), cluster_))
    assert large < 2.5 * small, (small, large)  # quadratic would be about 4x
