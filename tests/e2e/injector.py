"""Other vendors' mutating webhooks, for the end-to-end tests: served under gunicorn with TLS, they change
a GPU pod after ours has decided it, in the API server's last pass, where only our validating webhook
still sees the pod.

Two webhooks, both ordered after ours and reinvocable: /inject and /mark. In the first pass /inject only
marks the pod as seen and /mark adds an annotation, which makes the API server call every reinvocable
webhook once more, ours first; /inject, called again after ours, then adds `NVIDIA_VISIBLE_DEVICES=all`
to the first container (label `injector.example.com/inject: devices`) or only an annotation (`note`).

    python injector.py HOST:PORT CERT_DIR
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

SEEN = "injector.example.com/seen"


MARK = "injector.example.com/marked"


def answer(path: str, review: dict[str, Any]) -> dict[str, Any]:
    request = review["request"]
    pod = request.get("object") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    labels = (pod.get("metadata") or {}).get("labels") or {}
    ops: list[dict[str, Any]] = []
    what = labels.get("injector.example.com/inject")
    env_names = {e.get("name") for e in (pod.get("spec") or {}).get("containers", [{}])[0].get("env") or ()}
    if not what:
        pass
    elif path == "/mark":
        if MARK not in annotations:
            ops = [{"op": "add", "path": "/metadata/annotations", "value": {**annotations, MARK: "1"}}]
    elif SEEN not in annotations:
        ops = [{"op": "add", "path": "/metadata/annotations", "value": {**annotations, SEEN: "1"}}]
    elif what == "devices" and "NVIDIA_VISIBLE_DEVICES" not in env_names:
        container = pod["spec"]["containers"][0]
        env = [*(container.get("env") or []), {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        ops = [{"op": "add", "path": "/spec/containers/0/env", "value": env}]
    elif what == "note" and "injector.example.com/note" not in annotations:
        ops = [{"op": "add", "path": "/metadata/annotations/injector.example.com~1note", "value": "hello"}]
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    if ops:
        response.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(ops).encode()).decode())
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def app(environ: dict[str, Any], start_response: Any) -> Any:
    body = json.dumps(answer(environ.get("PATH_INFO", ""), json.loads(environ["wsgi.input"].read()))).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return (body,)


def main() -> None:
    from webhook.server.gunicorn_app import GunicornOptions, serve_forever
    from webhook.server.tls import TlsFiles

    bind, cert_dir = sys.argv[1], sys.argv[2]
    serve_forever(lambda: app, GunicornOptions(bind=bind), TlsFiles(f"{cert_dir}/tls.crt", f"{cert_dir}/tls.key"))


if __name__ == "__main__":
    main()
