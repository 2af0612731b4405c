"""The scheduling annotations a pod carries, read in full only when it carries one of them: the usual pod
gets the fields of no annotation, made once. Both answers must be the same."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from webhook.core.podspec import resources
from webhook.core.podspec.container import Notes


class Recording(Mapping[str, Any]):
    """Annotations that remember every key read of them."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data, self.read = data, set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self.data.get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return key in self.data

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


def test_every_key_the_full_reading_reads_is_one_the_quick_test_looks_for() -> None:
    for vendor in ("", "nvidia", "hygon", "cambricon"):
        recorded = Recording({"nvidia.com/use-gputype": "A100"})  # a selector, so the selectors are all read
        resources._read_scheduling(recorded, vendor, Notes())
        assert recorded.read <= resources._SCHEDULING_KEYS, recorded.read - resources._SCHEDULING_KEYS


def test_without_those_keys_the_answer_is_the_full_reading_s() -> None:
    for given in ({}, {"app": "x", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                        {"hami.io/vgpu-devices-allocated": "x", "nvidia.com/numa-bind": "true"}):
        notes = Notes()
        assert resources._scheduling(given, "nvidia", notes) == resources._read_scheduling(
            given, "nvidia", Notes())
        assert not notes.warnings and not notes.violations


def test_with_one_of_them_the_pod_s_annotation_is_read() -> None:
    notes = Notes()
    read = resources._scheduling({"hami.io/gpu-scheduler-policy": "spread", "app": "x"}, "nvidia", notes)
    assert read["gpu_placement"] == "spread" and read is not resources._NO_SCHEDULING
    read = resources._scheduling({"gpu-admission.io/placement": "binpack"}, "nvidia", notes)
    assert read["placement"] == "binpack"
