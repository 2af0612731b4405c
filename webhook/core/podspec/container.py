"""One container of a pod read: its GPU resources, host resources and env, with what is wrong noted.

Parsing never raises: a malformed value or a route around isolation becomes a violation (or a warning)
in the pod's `Notes`, with a message that says what to change.
"""

from __future__ import annotations

from collections.abc import Mapping

from webhook.core.domain.podview import ContainerView
from webhook.core.domain.refusal import Refusal
from webhook.core.domain.request import ContainerRequest, GpuRequest

from .accelerators import foreign_accelerator_message, looks_like_gpu
from .envvars import is_bypass_entry, is_limit_env, limit_env_of
from .limits import WIDENING_HINTS, is_pin
from .quantity import QuantityError, cpu_milli, memory_mib, parse_quantity
from .vendor_table import ADVERTISED_BY_NAME, MAX_GPU_MEMORY_MIB, MAX_GPUS, classify_resource, device_kind, mig_profile

MAX_WARNINGS = 10
_FIELD_NAMES = {"count": "GPU count", "memory": "memory", "memory_pct": "memory percentage", "cores": "cores",
                "mig": "device count"}
_MOVED_FIELDS = frozenset({"memory", "memory_pct", "cores"})


class Notes:
    """Violations and warnings collected while parsing one pod."""

    def __init__(self) -> None:
        self.violations: list[Refusal] = []
        self.warnings: list[str] = []
        self._seen: set[tuple[str, str]] = set()  # a set, so that a pod of n containers costs O(n)

    def deny(self, rule: str, code: int, message: str) -> None:
        if ("deny", message) not in self._seen:
            self._seen.add(("deny", message))
            self.violations.append(Refusal(rule, code, message))

    def warn(self, message: str) -> None:
        if ("warn", message) not in self._seen:
            self._seen.add(("warn", message))
            if len(self.warnings) < MAX_WARNINGS:
                self.warnings.append(message)
            elif len(self.warnings) == MAX_WARNINGS:  # a response carries a few, not one per container
                self.warnings.append("more warnings left out: the pod repeats the same problem in many containers")


def label(name: str, init: bool, index: int, kind: str | None = None) -> str:
    kind = kind or ("init container" if init else "container")
    return f"{kind} {name!r}" if name else f"{kind} #{index}"


def _gpu_value(field: str, name: str, raw: object, unit: int, where: str, notes: Notes) -> int | None:
    """A GPU resource value as a whole number within sensible bounds, or None after a violation."""
    if type(raw) is str and len(raw) <= 9 and raw.isascii() and raw.isdigit():
        value = int(raw)  # the usual "1" or "8000": no Fraction needed
    else:
        try:
            quantity = parse_quantity(raw)
        except QuantityError as err:
            notes.deny("invalid-quantity", 422, f"{where}: {name}: {err}; write {_hint(field, unit)}")
            return None
        if quantity.denominator != 1 or quantity.numerator < 0:  # int tests: Fraction comparisons are slow
            notes.deny("invalid-quantity", 422, f"{where}: {name} is {raw}; write {_hint(field, unit)}")
            return None
        value = int(quantity)
    if field in ("memory_pct", "cores") and not (0 if field == "cores" else 1) <= value <= 100:
        rule = "invalid-cores" if field == "cores" else "invalid-quantity"
        bounds = "0..100" if field == "cores" else "1..100"
        notes.deny(rule, 422, f"{where}: {name} is {value}, outside {bounds}; write {_hint(field, unit)}")
        return None
    if field == "memory" and not 1 <= value * unit <= MAX_GPU_MEMORY_MIB:
        notes.deny(
            "invalid-quantity",
            422,
            f"{where}: {name} is {raw}, {value * unit} MiB per GPU, which no GPU has; write {_hint(field, unit)}",
        )
        return None
    if field == "count" and value > MAX_GPUS:
        notes.deny("invalid-quantity", 422, f"{where}: {name} is {value} devices; write a count up to {MAX_GPUS}")
        return None
    return value * unit if field == "memory" else value


def _hint(field: str, unit: int) -> str:
    """What to write instead, for a message about a bad GPU value."""
    if field == "memory":
        return f"a whole number ({unit} MiB units), e.g. 3000" if unit != 1 else "a whole number of MiB, e.g. 3000"
    if field == "cores":
        return "a whole percentage 0..100 (0: no compute cap)"
    return "a whole number of devices, e.g. 1" if field == "count" else "a whole percentage 1..100"


def host_value(name: str, raw: object, where: str, notes: Notes) -> int:
    """A cpu (millicores) or memory (MiB) quantity; 0 after a violation."""
    try:
        value = cpu_milli(raw) if name == "cpu" else memory_mib(raw)
    except QuantityError as err:
        notes.deny(
            "invalid-quantity",
            422,
            f"{where}: {name}: {err}; write e.g. {'500m' if name == 'cpu' else '4Gi'}",
        )
        return 0
    if value < 0:
        notes.deny("invalid-quantity", 422, f"{where}: {name} is {raw}; write a value of at least 0")
        return 0
    return value


class _GpuFields:
    """The GPU resources one container names, read: field -> (resource name, value)."""

    __slots__ = ("values", "vendor", "moved", "named")

    def __init__(self) -> None:
        self.values: dict[str, tuple[str, int]] = {}
        self.vendor: str | None = None
        self.moved: list[str] = []  # slice resources named, which the mutation may move
        self.named = False  # a GPU resource named at all


def _gpu_fields(merged: Mapping[str, object], where: str, notes: Notes) -> _GpuFields:
    found = _GpuFields()
    values = found.values
    for name, raw in merged.items():
        kind = classify_resource(name) if isinstance(name, str) else None
        if kind is None:
            if isinstance(name, str) and name not in ("cpu", "memory") and looks_like_gpu(name):
                notes.warn(foreign_accelerator_message(where, name))
            continue
        found.named = True
        kind_vendor, field, unit = kind
        if field in _MOVED_FIELDS and name not in found.moved:
            found.moved.append(name)
        if found.vendor is not None and kind_vendor != found.vendor:
            notes.deny("mixed-vendors", 422,
                       f"{where} asks for {found.vendor} and {kind_vendor} devices; use one vendor per pod")
            continue
        found.vendor = kind_vendor
        if field == "device" and kind_vendor in ADVERTISED_BY_NAME:
            field = "mig"  # devices of a resource the plugin advertises by name: placed as MIG devices are
        elif field == "device":
            notes.warn(f"{where}: {name} is not in the vendor table; counted as whole {kind_vendor} devices")
            field = "count"
        value = _gpu_value("count" if field == "mig" else field, name, raw, unit, where, notes)
        if field in values:
            notes.deny("duplicate-resource", 422,
                       f"{where} gives the {_FIELD_NAMES[field]} twice ({values[field][0]} and {name}); keep one")
            continue
        if value is not None:
            values[field] = (name, value)
    return found


def _gpu_request(found: _GpuFields, where: str, notes: Notes) -> GpuRequest | None:
    """The container's GPU request from the fields it names; None for none, or after a violation."""
    values, vendor = found.values, found.vendor
    if "memory" in values and "memory_pct" in values:
        # HAMi's Fit takes the absolute figure when both are given; so do we, saying so.
        notes.warn(f"{where} sets {values['memory'][0]} and {values['memory_pct'][0]}; "
                   f"{values['memory'][0]} applies")
        del values["memory_pct"]
    if "mig" in values:  # whole devices of one MIG profile or advertised resource, nothing else here
        name = values["mig"][0]
        if len(values) > 1:
            others = ", ".join(v[0] for f, v in values.items() if f != "mig")
            why = ("a MIG device is bounded by its profile: ask for the MIG devices alone" if mig_profile(name)
                   else f"its device plugin hands out {name} as it is: ask for it alone")
            notes.deny("mig-mixed", 422, f"{where} asks for {name} together with {others}; {why}")
        elif values["mig"][1] > 0:
            return GpuRequest(vendor or "nvidia", values["mig"][1], mig=device_kind(name))
        return None
    if vendor is None:
        return None
    count = values["count"][1] if "count" in values else (1 if values else 0)
    if count == 0 and len(values) > 1:
        notes.deny("invalid-quantity", 422,
                   f"{where} sets {values['count'][0]} to 0 together with GPU memory "
                   "or cores; ask for at least 1 GPU or remove them")
    if count <= 0:
        return None
    return GpuRequest(vendor, count, _get(values, "memory"), _get(values, "memory_pct"), _get(values, "cores"))


def _get(values: Mapping[str, tuple[str, int]], field: str) -> int | None:
    return values[field][1] if field in values else None


def _env_findings(container: ContainerView, where: str, exempt_env: bool, gpu_signal: bool, notes: Notes,
                  findings: list[Refusal]) -> bool:
    """The container's env checked: a bypass variable denied, LD_PRELOAD added to `findings` (it matters
    in a GPU pod only); returns whether the container is a GPU one, a bypass variable making it one."""
    exempt: dict[str, str] | None = None  # limit_env_of(container), made when an entry needs it
    for fields in container.env:
        env_name = fields.get("name")
        if not isinstance(env_name, str):
            continue
        if exempt_env and gpu_signal and isinstance(fields.get("value"), str) and is_limit_env(env_name):
            continue  # a limit the record dictates (exempt by itself), in a container already a GPU one
        bypass = is_bypass_entry(fields)
        gpu_signal = gpu_signal or bypass
        if not bypass and env_name != "LD_PRELOAD":
            continue
        if exempt is None:
            exempt = limit_env_of(container.raw) if exempt_env else {}
        if env_name in exempt:
            continue
        if bypass:
            notes.deny(
                "isolation-env",
                403,
                f"{where} sets {env_name} itself, which bypasses GPU isolation; remove it and "
                + WIDENING_HINTS.get(env_name, "ask for GPUs in resources.limits (e.g. nvidia.com/gpu: 1)"),
            )
        elif env_name == "LD_PRELOAD" and not is_pin(env_name, fields):  # "" pins it off
            findings.append(Refusal(
                "isolation-env", 403,
                f"{where} sets LD_PRELOAD, which can unload the GPU limit library; remove it from a GPU pod"))
    return gpu_signal


def parse_container(container: ContainerView, exempt_env: bool, notes: Notes, label_kind: str | None = None,
                    ) -> tuple[ContainerRequest, list[Refusal], bool]:
    """One container; returns it, the isolation findings that apply only to GPU pods, and whether the
    container alone makes a GPU pod (a GPU resource named, or a device variable set: see is_gpu_pod)."""
    init, index, limits, requests = container.kind == "initContainers", container.index, container.limits, \
        container.requests
    where = label(container.name, init, index, label_kind)
    found = _gpu_fields({**requests, **limits} if requests else limits, where, notes)  # GPU resources: limits win
    gpu = _gpu_request(found, where, notes)
    host_cpu, host_mem = 0, 0
    for name in ("cpu", "memory"):
        raw = requests.get(name, limits.get(name))
        if raw is not None:
            value = host_value(name, raw, where, notes)
            host_cpu, host_mem = (value, host_mem) if name == "cpu" else (host_cpu, value)
    findings: list[Refusal] = []
    gpu_signal = _env_findings(container, where, exempt_env, found.named, notes, findings)
    if container.privileged:
        findings.append(Refusal(
            "isolation-privileged", 403,
            f"{where} is privileged, which exposes every GPU of the node; set securityContext.privileged: false"))
    request = ContainerRequest(container.name, index, init, gpu, host_cpu, host_mem, tuple(found.moved))
    return request, findings, gpu_signal
