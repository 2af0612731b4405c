"""The NVML boundary: the only place that imports `pynvml` (package `nvidia-ml-py`, the `agent` extra).

Everything else in the agent receives the module object, so tests hand in a fake with the same names
and no GPU is needed to exercise discovery, publishing or metrics.
"""

from __future__ import annotations

from contextlib import suppress
from types import ModuleType
from typing import Any

INSTALL_HINT = "install the agent extra: pip install 'gpu-admission[agent]'"
DRIVER_HINT = "is the NVIDIA driver installed, and are the GPUs and libnvidia-ml visible to this container?"


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine: no bindings, no library, no driver. The agent exits 3."""


def load_nvml() -> ModuleType:
    """Import pynvml, or raise NvmlUnavailable with a line that says what to install."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError as err:
        raise NvmlUnavailable(f"the NVML Python bindings are missing ({err}); {INSTALL_HINT}") from None
    module: ModuleType = pynvml
    return module


def start(nvml: Any) -> None:
    """nvmlInit, turning every way it fails (library not found, driver not loaded, version mismatch,
    no permission) into NvmlUnavailable."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        raise NvmlUnavailable(f"NVML is not available: {error_text(err)}; {DRIVER_HINT}") from None
    except OSError as err:  # a libnvidia-ml that exists but cannot be loaded
        raise NvmlUnavailable(f"NVML is not available: {err}; {DRIVER_HINT}") from None


def stop(nvml: Any) -> None:
    """nvmlShutdown, ignoring errors: it runs on the way out."""
    with suppress(nvml.NVMLError):
        nvml.nvmlShutdown()


def unsupported(nvml: Any) -> tuple[type[BaseException], ...]:
    """The errors that mean "this device or driver does not offer that query" rather than a fault."""
    return (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound)


def optional(nvml: Any, name: str) -> Any:
    """The binding `name`, or, with bindings older than it, a stand-in that raises FunctionNotFound as
    NVML itself does for a driver that lacks the call."""
    function = getattr(nvml, name, None)
    if function is not None:
        return function

    def missing(*_args: Any) -> Any:
        raise nvml.NVMLError_FunctionNotFound()

    return missing


def error_text(err: BaseException) -> str:
    """NVML's own wording of an error ("Driver Not Loaded"), falling back to the class name."""
    text = str(err).strip()
    return text or type(err).__name__


def text(value: Any) -> str:
    """NVML strings are `str` in current bindings and `bytes` in older ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
