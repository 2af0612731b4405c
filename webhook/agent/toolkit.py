"""The node's NVIDIA container toolkit settings that decide whether NVIDIA_VISIBLE_DEVICES is a route.

The toolkit (nvidia-container-runtime and its hook) reads /etc/nvidia-container-runtime/config.toml.
Two top-level keys matter here:
  * accept-nvidia-visible-devices-envvar-when-unprivileged (default true): false makes the toolkit ignore
    NVIDIA_VISIBLE_DEVICES in unprivileged containers, wherever it comes from (the pod spec, or the
    image: CUDA images set NVIDIA_VISIBLE_DEVICES=all), which only the node can guarantee;
  * accept-nvidia-visible-devices-as-volume-mounts (default false): the device plugin then hands devices
    over as mounts under /var/run/nvidia-container-devices (its `volume-mounts` device list strategy).
A missing file is "unknown" (the toolkit may not be installed, or lives elsewhere): never a guess.
"""

from __future__ import annotations

import tomllib
from typing import Any

DEFAULT_PATH = "/etc/nvidia-container-runtime/config.toml"
ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
MOUNTS_KEY = "accept-nvidia-visible-devices-as-volume-mounts"


class ToolkitConfigError(Exception):
    """The file exists but cannot be read as the toolkit reads it; the message is one line."""


def read_toolkit(path: str, shown_path: str | None = None) -> dict[str, Any] | None:
    """The GPUInventory `toolkit` object for the config at `path`, or None when there is no such file.

    `shown_path` is the path recorded in the object (the host's path when the agent reads a mount)."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ToolkitConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise ToolkitConfigError(f"{path}: not valid TOML: {err}") from None
    return toolkit_from_toml(data, shown_path or path, path)


def toolkit_from_toml(data: dict[str, Any], shown_path: str, path: str = "") -> dict[str, Any]:
    where = path or shown_path
    envvar = data.get(ENVVAR_KEY, True)
    mounts = data.get(MOUNTS_KEY, False)
    for key, value in ((ENVVAR_KEY, envvar), (MOUNTS_KEY, mounts)):
        if not isinstance(value, bool):
            raise ToolkitConfigError(f"{where}: {key} must be true or false, got {value!r}")
    toolkit: dict[str, Any] = {
        "configPath": shown_path,
        "acceptEnvvarUnprivileged": envvar,
        "acceptVolumeMounts": mounts,
    }
    runtime = data.get("nvidia-container-runtime")
    mode = runtime.get("mode") if isinstance(runtime, dict) else None
    if isinstance(mode, str) and mode:
        toolkit["mode"] = mode
    return toolkit
