"""Connecting to the API server: in-cluster service account, or a kubeconfig file and context."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from webhook.errors import UserError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (SERVICE_ACCOUNT / "token").exists()


def load_api_client(kubeconfig: str | None = None, context: str | None = None, *, in_cluster_only: bool = False) -> Any:
    """A kubernetes `ApiClient`: from `kubeconfig` (and `context`) when given, else the pod's service
    account when running in a cluster, else `$KUBECONFIG` or `~/.kube/config` as kubectl does.
    `in_cluster_only`: the service account or an error, never a kubeconfig file.

    Raises UserError with one line naming the file or context that is wrong.
    """
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    if in_cluster_only and not in_cluster():
        raise UserError(f"not running in a cluster: no KUBERNETES_SERVICE_HOST or no token under {SERVICE_ACCOUNT}")
    if kubeconfig is None and context is None and in_cluster():
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException as error:
            raise UserError(f"in-cluster configuration: {error}") from None
        return client.ApiClient(configuration)
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube/config")
    if not Path(path).is_file():
        if kubeconfig:
            raise UserError(f"{path}: --kubeconfig file not found")
        raise UserError(f"{path}: no kubeconfig file, and not running in a cluster; give --kubeconfig FILE")
    try:
        return config.new_client_from_config(config_file=path, context=context)  # type: ignore[no-untyped-call]
    except ConfigException as error:
        raise UserError(f"{path}: {error}") from None
    except Exception as error:  # YAML errors, missing certificate files named by the kubeconfig
        raise UserError(f"{path}: cannot load kubeconfig: {error}") from None


def own_namespace(default: str = "gpu-admission") -> str:
    """The namespace this webhook runs in (for its reservation ConfigMaps)."""
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    path = SERVICE_ACCOUNT / "namespace"
    if path.exists():
        return path.read_text().strip() or default
    return default
