"""The container a gpu-fraction / gpu-memory share (KAI-Scheduler, Run:ai) belongs to, as KAI's binder
chooses it: GetFractionContainerRef in KAI-Scheduler's pkg/binder/common/gpu_access.go takes the
container gpu-fraction-container-name names (init containers first), else spec.containers[0]. An Argo
pod's first container is Argo's executor, never the step."""

from __future__ import annotations

import pytest

from webhook.core.podspec.kai import fraction_container

# (name, init) as the pod parser lists containers: app containers, then init containers
POD = [("app", False), ("logger", False), ("setup", True), ("logger", True)]
ARGO = [("wait", False), ("main", False), ("init", True)]
ARGO_POD = {"workflows.argoproj.io/node-name": "wf.step"}


@pytest.mark.parametrize(("annotations", "position"), [
    ({}, 0),  # spec.containers[0]
    ({"gpu-fraction-container-name": "logger"}, 3),  # an init container of that name is looked at first
    ({"gpu-fraction-container-name": "setup"}, 2),
    ({"gpu-fraction-container-name": "app"}, 0),
])
def test_kai_choice(annotations: dict[str, str], position: int) -> None:
    assert fraction_container(POD, {"gpu-fraction": "0.5", **annotations}) == (position, None)


def test_a_name_that_is_no_container_is_refused() -> None:
    target = fraction_container(POD, {"gpu-fraction-container-name": "gpu"})
    assert target == (None, "annotation gpu-fraction-container-name is 'gpu', which names no container of the pod; "
                            "write the name of the container that uses the GPU")


@pytest.mark.parametrize("executor", ["wait", "supervisor"])  # supervisor: Argo's init-less pod layout
def test_argo_executor_first_is_refused_naming_the_annotation_that_fixes_it(executor: str) -> None:
    target = fraction_container([(executor, False), *ARGO[1:]], {"gpu-memory": "4000", **ARGO_POD})
    assert target.position is None
    assert target.problem is not None and target.problem.endswith(
        "add gpu-fraction-container-name: main to the template's metadata.annotations")
    assert f"Argo makes its {executor!r} executor" in target.problem


def test_argo_pod_naming_main_or_a_pod_that_is_not_argos() -> None:
    assert fraction_container(ARGO, {"gpu-fraction-container-name": "main", **ARGO_POD}) == (1, None)
    assert fraction_container(ARGO, {"gpu-fraction": "0.5"}) == (0, None)  # a container that happens to be "wait"
