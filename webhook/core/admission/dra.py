"""GPUs through Dynamic Resource Allocation (resource.k8s.io): counted like any other GPU, or refused.

A pod names claims in `spec.resourceClaims` (`resourceClaimName`: one existing ResourceClaim;
`resourceClaimTemplateName`: a claim made for this pod from a template). Each claim's requests for a
GPU device class (policy `dra.deviceClasses`) add their `count` to the pod's GPUs, which then meet the
same quota and per-namespace rules as `nvidia.com/gpu`. What cannot be counted is refused with the
reason: allocationMode All (every matching device, a number only the scheduler knows), adminAccess
(access to devices other pods hold), a claim the webhook has not seen, and, where the namespace allows
only some GPU models, a claim whose selectors do not pin one.
Placement stays with the scheduler's DRA plugin: no node affinity, no per-GPU limits are written.

A ResourceClaim several pods share (NVIDIA's `gpu-test3`: two pods name one claim) is one set of GPUs:
the watch cache counts it once, with the live pods that hold it (`held_usage`), so a pod naming a claim
that a live pod already holds is charged nothing more for it; its rules (model, adminAccess, All) still
apply. Claims of classes that are no GPU class (ComputeDomain IMEX channels,
`compute-domain-default-channel.nvidia.com`; NICs) count 0 GPUs and pass. A claim or template the
webhook has not seen is refused, whatever its name: it could hold GPUs, and a name proves nothing (a
ComputeDomain's channel template, made by its controller moments after the ComputeDomain, is named by
the user in `spec.channel.resourceClaimTemplate.name`); the pod's controller retries its create.

Extended resources that a DeviceClass serves through DRA (`extendedResourceName`, Kubernetes 1.34+)
are asked in `resources` like any device: `nvidia.com/gpu` is counted there already (and the claim the
scheduler then makes for the pod is not counted again, since no pod names it); names the vendor table
does not know are counted as whole GPUs when the policy lists them (`dra.extendedResources`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from webhook.core.domain.model import Allocation, Claim, DeviceAsk, Node, Snapshot, TopologyClass, Usage
from webhook.core.domain.podview import PodView
from webhook.core.domain.refusal import Refusal
from webhook.core.domain.request import PodRequest
from webhook.core.podspec.accelerators import looks_like_gpu
from webhook.core.podspec.coerce import list_of, mapping_of
from webhook.core.podspec.fastpath import is_gpu_pod
from webhook.core.podspec.quantity import QuantityError, parse_quantity
from webhook.core.podspec.vendor_table import MAX_GPUS
from webhook.core.podspec.view import view_for
from webhook.core.policy.model import DRA_DEVICE_CLASSES, Policy

CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
ALLOCATION_MODES = ("ExactCount", "All")
_ATTR = r"""device\.attributes\[\s*["']gpu\.nvidia\.com["']\s*\]\.{name}"""
_EQUALS = r"""\s*==\s*["']([^"']+)["']"""
_PRODUCT = re.compile(_ATTR.format(name="productName") + _EQUALS)
_PROFILE = re.compile(_ATTR.format(name="profile") + _EQUALS)
_PROFILE_MEMORY = re.compile(r"^\d+(?:c\.)?\d*g\.(\d+)gb", re.IGNORECASE)  # "3g.40gb", "1c.3g.40gb"


# ------------------------------------------------------------------------------------------ reading


def read_claim(obj: Mapping[str, Any], kind: str | None = None) -> Claim:
    """A ResourceClaim or ResourceClaimTemplate (v1, v1beta2 or v1beta1 shape) as a Claim; `kind`
    when the object does not say (the items of a list).

    Raises ValueError whose message starts with the field ("spec.devices.requests[0].exactly.count: ...").
    """
    kind = kind or obj.get("kind")
    metadata = mapping_of(obj.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name: required")
    namespace = str(metadata.get("namespace") or "default")
    spec = mapping_of(obj.get("spec"))
    where = "spec.spec.devices" if kind == "ResourceClaimTemplate" else "spec.devices"
    if kind == "ResourceClaimTemplate":
        spec = mapping_of(spec.get("spec"))
    devices = spec.get("devices")
    if devices is not None and not isinstance(devices, Mapping):
        raise ValueError(f"{where}: expected a mapping")
    requests: list[tuple[str, tuple[DeviceAsk, ...]]] = []
    raw_requests = mapping_of(devices).get("requests")
    if raw_requests is not None and not isinstance(raw_requests, list):
        raise ValueError(f"{where}.requests: expected a list")
    for i, raw in enumerate(raw_requests or ()):
        at = f"{where}.requests[{i}]"
        request = mapping_of(raw)
        label = str(request.get("name") or f"#{i}")
        if "firstAvailable" in request:
            alternatives = list_of(request.get("firstAvailable"))
            if not alternatives:
                raise ValueError(f"{at}.firstAvailable: expected a non-empty list")
            asks = tuple(_ask(mapping_of(a), f"{at}.firstAvailable[{j}]") for j, a in enumerate(alternatives))
        elif "exactly" in request:
            asks = (_ask(mapping_of(request.get("exactly")), f"{at}.exactly"),)
        else:  # v1beta1: the request is the ask
            asks = (_ask(request, at),)
        requests.append((label, asks))
    reserved = []
    for consumer in list_of(mapping_of(obj.get("status")).get("reservedFor")):
        entry = mapping_of(consumer)
        reserved.append(f"{entry.get('resource') or 'pods'}/{entry.get('name') or ''}")
    return Claim(namespace, name, tuple(requests), tuple(reserved))


def _ask(data: Mapping[str, Any], at: str) -> DeviceAsk:
    device_class = data.get("deviceClassName")
    if not isinstance(device_class, str) or not device_class:
        raise ValueError(f"{at}.deviceClassName: required")
    mode = data.get("allocationMode") or "ExactCount"
    if mode not in ALLOCATION_MODES:
        raise ValueError(f"{at}.allocationMode: expected ExactCount or All, got {mode!r}")
    count = 1
    if mode == "ExactCount" and data.get("count") is not None:
        try:
            quantity = parse_quantity(data["count"])
        except QuantityError as err:
            raise ValueError(f"{at}.count: {err}") from None
        if quantity.denominator != 1 or not 1 <= quantity <= MAX_GPUS:
            raise ValueError(f"{at}.count: expected a whole number 1..{MAX_GPUS}, got {data['count']!r}")
        count = int(quantity)
    selectors = []
    for j, selector in enumerate(list_of(data.get("selectors"))):
        expression = mapping_of(mapping_of(selector).get("cel")).get("expression")
        if not isinstance(expression, str):
            raise ValueError(f"{at}.selectors[{j}].cel.expression: required")
        selectors.append(expression)
    admin = data.get("adminAccess")
    if admin is not None and not isinstance(admin, bool):
        raise ValueError(f"{at}.adminAccess: expected true or false, got {admin!r}")
    return DeviceAsk(device_class, count, mode == "All", tuple(selectors), admin is True)


def pinned(selectors: tuple[str, ...], pattern: re.Pattern[str]) -> str | None:
    """The value a CEL selector pins an attribute to (`attr == "x"`, alone or ANDed with other terms),
    or None when no selector decides it. Selectors of one request are ANDed, so one pin is enough."""
    for expression in selectors:
        if "||" in expression or "!" in expression.replace("!=", ""):
            continue  # an alternative or a negation: not a pin we can read
        for term in expression.split("&&"):
            found = pattern.fullmatch(term.strip().strip("()").strip())
            if found:
                return found.group(1)
    return None


# ------------------------------------------------------------------------------------------ counting


class Tally:
    """GPUs, models and violations gathered over a pod's (or one object's) claims."""

    def __init__(self) -> None:
        self.gpus = 0
        self.memory_mib = 0  # the largest per-GPU memory a profile selector pins (0: whole cards)
        self.models: list[str] = []
        self.violations: list[Refusal] = []

    def deny(self, rule: str, code: int, message: str) -> None:
        if all(v.message != message for v in self.violations):
            self.violations.append(Refusal(rule, code, message))


def count_claim(claim: Claim, where: str, namespace: str, policy: Policy, tally: Tally) -> None:
    """Add one claim's GPU requests to `tally`; what cannot be counted becomes a violation."""
    classes = policy.dra_device_classes
    allowed = policy.rule(namespace).allowed_models
    for label, asks in claim.requests:
        gpu_asks = [a for a in asks if a.device_class in classes]
        if not gpu_asks:
            continue
        at = f"{where} request {label!r}"
        for ask in gpu_asks:
            if ask.all_devices:
                tally.deny("dra-all-devices", 403,
                           f"{at} asks for all devices of class {ask.device_class} (allocationMode: All), which "
                           "cannot be counted against GPU quotas: use allocationMode: ExactCount with a count")
            if ask.admin_access:
                tally.deny("dra-admin-access", 403,
                           f"{at} sets adminAccess: true, which reaches GPUs other pods hold; it is refused "
                           f"in namespace {namespace}: remove adminAccess")
            if allowed:
                model = pinned(ask.selectors, _PRODUCT)
                if model is None:
                    tally.deny("dra-model-undecided", 403,
                               f"{at}: namespace {namespace} may use only {', '.join(allowed)} GPUs, and the "
                               "claim's selectors do not pin a model: add a selector "
                               f"device.attributes[\"gpu.nvidia.com\"].productName == \"<model>\"")
                elif not any(p.strip().lower() in model.lower() for p in allowed if p.strip()):
                    tally.deny("model-not-allowed", 403,
                               f"{at} asks for GPU model {model}; namespace {namespace} may use only "
                               f"{', '.join(allowed)}")
                elif model not in tally.models:
                    tally.models.append(model)
            profile = pinned(ask.selectors, _PROFILE)
            memory = _PROFILE_MEMORY.match(profile) if profile else None
            if memory:
                tally.memory_mib = max(tally.memory_mib, int(memory.group(1)) * 1024)
        # The scheduler takes the first alternative that fits: count the largest, never less.
        tally.gpus += max(a.count for a in gpu_asks)


def _extended(pod: PodView, names: tuple[str, ...]) -> int:
    """Whole GPUs asked through DRA-backed extended resources, init containers counted as Kubernetes does."""
    app = sidecars = peak = 0
    for container in pod.of_kind("containers", "initContainers"):  # app containers first
        merged = {**container.requests, **container.limits}
        value = 0
        for name in names:
            try:
                quantity = parse_quantity(merged[name]) if name in merged else 0
            except QuantityError:
                continue  # left to the API server, which refuses a malformed quantity
            value += int(quantity) if quantity >= 0 else 0
        if container.kind == "containers":
            app += value
        elif container.restart_policy == "Always":
            sidecars += value
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + value)
    return max(app + sidecars, peak)


def names_claims(pod: Mapping[str, Any]) -> bool:
    """A pod naming DRA claims: it must reach the decision, whatever its containers ask."""
    spec = pod.get("spec")
    return isinstance(spec, dict) and bool(spec.get("resourceClaims"))


def may_use_gpu(pod: Mapping[str, Any]) -> bool:
    """The server's fast-path test: a GPU pod, a pod naming DRA claims, or one asking for a resource that
    looks like an accelerator (a DRA-backed extended resource may be one)."""
    if is_gpu_pod(pod):
        return True
    spec = mapping_of(pod.get("spec"))
    if list_of(spec.get("resourceClaims")):
        return True
    for key in ("containers", "initContainers"):
        for container in list_of(spec.get(key)):
            resources = mapping_of(mapping_of(container).get("resources"))
            for section in ("limits", "requests"):
                if any(isinstance(n, str) and looks_like_gpu(n) for n in mapping_of(resources.get(section))):
                    return True
    return False


def with_claims(request: PodRequest, snapshot: Snapshot, policy: Policy) -> PodRequest:
    """`request` with the GPUs of its DRA claims and DRA-backed extended resources counted in."""
    view = view_for(request)
    entries = view.resource_claims
    extended = policy.dra_extended_resources
    if not entries and not extended:
        return request
    tally = Tally()
    shared: list[str] = []  # claims live pods already hold: counted with them
    seen_claim = False  # a claim that may hold GPUs: the pod is decided, not waved through
    for i, entry in enumerate(entries):
        where = f"spec.resourceClaims[{i}]"
        claim_name, template_name = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if isinstance(claim_name, str) and claim_name:
            kind, name, table = "ResourceClaim", claim_name, snapshot.claims
        elif isinstance(template_name, str) and template_name:
            kind, name, table = "ResourceClaimTemplate", template_name, snapshot.claim_templates
        else:
            seen_claim = True
            tally.deny("dra-invalid", 422, f"{where} names neither resourceClaimName nor resourceClaimTemplateName")
            continue
        claim = table.get(f"{request.namespace}/{name}")
        if claim is None:
            seen_claim = True
            tally.deny("dra-unknown-claim", 403,
                       f"{where}: {kind} {request.namespace}/{name} is not known to the GPU admission webhook, so "
                       "its GPUs cannot be counted: create it first, then the pod (one a controller makes, such as a "
                       "ComputeDomain's channel template, admits the pod once it exists; a Job's pods are retried)")
            continue
        holders = held_by(snapshot, request.namespace, kind, name)
        counted = Tally() if holders else tally
        count_claim(claim, f"{kind} {name}", request.namespace, policy, counted)
        if not counted.gpus and not counted.violations:
            continue  # no GPU request in it (a NIC, a compute-domain channel): not ours to count
        seen_claim = True
        if counted is not tally:
            # Shared with live pods: its GPUs are in the namespace's usage already (once, with them).
            for v in counted.violations:
                tally.deny(v.rule, v.code, v.message)
            tally.models += [m for m in counted.models if m not in tally.models]
            shared.append(f"ResourceClaim {name} is shared with {holders} pod(s): its GPUs are counted once")
    extra = _extended(view, extended) if extended else 0
    warnings = request.warnings + tuple(shared)
    if extra:
        # Counted now: drop parse_pod's "not a GPU resource this controller knows" for those names.
        warnings = tuple(w for w in warnings if not any(f": {n} " in w for n in extended))
    gpus = tally.gpus + extra
    if not gpus and not seen_claim:
        return request
    violations = list(request.violations) + tally.violations
    if gpus and request.gpus:
        violations.append(Refusal("mixed-gpu-sources", 422,
                                    f"asks for {request.gpus} GPU(s) in resources and {gpus} through DRA; "
                                    "ask for GPUs one way per pod"))
    return request.evolve(
        gpus=request.gpus + gpus,
        dra_gpus=gpus,
        vendor=request.vendor or "nvidia",
        models_include=request.models_include + tuple(tally.models),
        memory_mib=None,
        is_gpu_pod=True,
        violations=tuple(violations),
        warnings=warnings,
    )


def held_by(snapshot: Snapshot, namespace: str, kind: str, name: str) -> int:
    """How many live pods hold the ResourceClaim `namespace/name` (0 for a template: each pod gets its own
    claim from it). Their namespace's usage counts its GPUs already (`held_usage`)."""
    if kind != "ResourceClaim":
        return 0
    return snapshot.claim_users.get(namespace, {}).get((kind, f"{namespace}/{name}"), 0)


def allocation(request: PodRequest, snapshot: Snapshot, policy: Policy) -> Allocation:
    """The decision record of a pod whose GPUs come through DRA: the count and, for memory quotas, the
    card size (of the pinned model, else the largest card of the cluster: never less than it holds)."""
    tally = Tally()
    for entry in view_for(request).resource_claims:
        name = entry.get("resourceClaimName") or entry.get("resourceClaimTemplateName")
        table = snapshot.claims if entry.get("resourceClaimName") else snapshot.claim_templates
        claim = table.get(f"{request.namespace}/{name}")
        kind = CLAIM_KINDS[0] if entry.get("resourceClaimName") else CLAIM_KINDS[1]
        if claim is not None and not held_by(snapshot, request.namespace, kind, str(name)):
            count_claim(claim, "", request.namespace, policy, tally)
    models = [m.lower() for m in request.models_include]
    cards = [g.memory_mib for n in snapshot.nodes.values() if n.vendor == "nvidia" for g in n.gpus
             if not models or any(m in g.model.lower() for m in models)]
    memory = tally.memory_mib or max(cards, default=0)
    model = request.models_include[0] if len(request.models_include) == 1 else ""
    topology = TopologyClass.SINGLE if request.gpus <= 1 else TopologyClass.PCIE
    return Allocation(None, (), request.gpus, memory, 100, "nvidia", model, topology, 0.0, "dra")


# ------------------------------------------------------------------------------------------ running pods


def claim_refs(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The claims a live pod holds, from fields its owner cannot edit: ("ResourceClaim", "ns/name") for
    each named claim and each claim made from a template (status.resourceClaimStatuses names it), and
    ("ResourceClaimTemplate", "ns/name") for a template whose claim is not made yet. () when none."""
    spec = mapping_of(pod.get("spec"))
    entries = list_of(spec.get("resourceClaims"))
    if not entries:
        return ()
    metadata, status = mapping_of(pod.get("metadata")), mapping_of(pod.get("status"))
    if status.get("phase") in ("Succeeded", "Failed"):
        return ()
    namespace = str(metadata.get("namespace") or "default")
    made = {mapping_of(s).get("name"): mapping_of(s).get("resourceClaimName")
            for s in list_of(status.get("resourceClaimStatuses"))}
    refs: list[tuple[str, str]] = []
    for raw in entries:
        entry = mapping_of(raw)
        claim, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        generated = made.get(entry.get("name"))
        if isinstance(claim, str) and claim:
            refs.append(("ResourceClaim", f"{namespace}/{claim}"))
        elif isinstance(generated, str) and generated:
            refs.append(("ResourceClaim", f"{namespace}/{generated}"))
        elif isinstance(template, str) and template:
            refs.append(("ResourceClaimTemplate", f"{namespace}/{template}"))
    return tuple(refs)


def claim_gpus(claim: Claim, classes: tuple[str, ...]) -> int:
    """GPUs a claim holds (its largest alternative per request; allocationMode All counts its ask as 1,
    the least it can hold: such claims are refused in managed namespaces)."""
    total = 0
    for _, asks in claim.requests:
        counts = [1 if a.all_devices else a.count for a in asks if a.device_class in classes]
        total += max(counts, default=0)
    return total


def largest_card(nodes: Mapping[str, Node]) -> int:
    """MiB of the largest NVIDIA card of the cluster (0 without one)."""
    return max((g.memory_mib for n in nodes.values() if n.vendor == "nvidia" for g in n.gpus), default=0)


def claim_users(holders: Mapping[str, tuple[str, tuple[tuple[str, str], ...]]]
                ) -> dict[str, dict[tuple[str, str], int]]:
    """Per namespace, how many live pods hold each claim or template (`holders`: pod key -> (namespace,
    refs), as `held_usage` takes them)."""
    users: dict[str, dict[tuple[str, str], int]] = {}
    for namespace, refs in holders.values():
        table = users.setdefault(namespace, {})
        for ref in set(refs):
            table[ref] = table.get(ref, 0) + 1
    return users


def held_usage(holders: Mapping[str, tuple[str, tuple[tuple[str, str], ...]]], claims: Mapping[str, Claim],
               templates: Mapping[str, Claim], card_mib: int,
               classes: tuple[str, ...] = DRA_DEVICE_CLASSES) -> dict[str, Usage]:
    """What live pods hold through DRA, per namespace: each claim once however many pods share it, and a
    template's GPUs for each pod whose claim is not made yet. `holders`: pod key -> (namespace, refs).
    Whole devices: `card_mib` of memory (the largest card, as admission counts) and 100 % per GPU."""
    seen: set[str] = set()
    gpus: dict[str, int] = {}
    for namespace, refs in holders.values():
        for kind, key in refs:
            if kind == "ResourceClaim":
                if key in seen or key not in claims:
                    continue
                seen.add(key)
                count = claim_gpus(claims[key], classes)
            else:
                template = templates.get(key)
                count = claim_gpus(template, classes) if template is not None else 0
            if count:
                gpus[namespace] = gpus.get(namespace, 0) + count
    return {ns: Usage(n, n * card_mib, n * 100) for ns, n in gpus.items()}
