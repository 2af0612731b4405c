"""Replicas with an elected decider: a follower relays each review to the decider and its answer back
unchanged; the decider's /peer/ paths take only reviews signed with the shared record key; with no
decider to reach, the answer is a 503 the API server applies its failurePolicy to."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from server_support import build_snapshot, cluster_objects, gpu_pod_review

from webhook.server.app import ServerConfig, create_app, handler_of
from webhook.server.peer import PEER_HEADER, PeerError, signature
from webhook.server.source import StaticSource

KEY = b"k" * 32


@dataclass(frozen=True)
class Lead:
    leader: bool
    deciding: bool
    peer: str | None
    holder: str = "decider-0"

    def why_not(self) -> str:
        return "no GPU admission decider is elected yet"


class ElectedSource(StaticSource):
    """A static picture with a leadership the test sets."""

    lead = Lead(False, False, None)

    def leadership(self) -> Lead:
        return self.lead


def app(lead: Lead, key: bytes | None = KEY) -> Any:
    source = ElectedSource(build_snapshot(cluster_objects()))
    source.lead = lead
    return create_app(ServerConfig(source=source, namespace="gpu-admission", record_key=key))


class Relay:
    """The forwarding client, posting to the decider's app in process instead of over TLS."""

    def __init__(self, decider: Any, fail: bool = False) -> None:
        self.client = decider.test_client()
        self.fail = fail
        self.calls: list[str] = []

    def forward(self, peer: str, endpoint: str, body: bytes, content_type: str | None) -> tuple[int, bytes]:
        self.calls.append(f"{peer} {endpoint}")
        if self.fail:
            raise PeerError(f"the GPU admission decider at {peer} did not answer: timed out")
        answer = self.client.post(f"/peer/{endpoint}", data=body, content_type=content_type,
                                  headers={PEER_HEADER: signature(KEY, endpoint, body)})
        return answer.status_code, answer.get_data()


def post(flask_app: Any, path: str, body: bytes, **headers: str) -> tuple[int, Any]:
    answer = flask_app.test_client().post(path, data=body, content_type="application/json", headers=headers)
    return answer.status_code, json.loads(answer.get_data())


def test_a_follower_relays_the_deciders_answer_unchanged() -> None:
    decider = app(Lead(True, True, None))
    follower = app(Lead(False, False, "https://10.0.0.5:8443"))
    relay = Relay(decider)
    handler_of(follower).peer = relay
    body = json.dumps(gpu_pod_review(gpus=2)).encode()
    status, answer = post(follower, "/mutate", body)
    direct = post(app(Lead(True, True, None)), "/mutate", body)
    assert relay.calls == ["https://10.0.0.5:8443 mutate"]
    assert status == 200 and answer["response"]["allowed"] is True
    assert answer["response"]["patch"] == direct[1]["response"]["patch"]  # the decider's own answer
    assert post(follower, "/validate", body)[0] == 200 and relay.calls[-1].endswith(" validate")


def test_the_decider_takes_only_signed_reviews_and_never_forwards_them_again() -> None:
    decider = app(Lead(True, True, None))
    body = json.dumps(gpu_pod_review()).encode()
    assert post(decider, "/peer/validate", body)[0] == 403
    assert post(decider, "/peer/validate", body, **{PEER_HEADER: "0" * 64})[0] == 403
    assert post(decider, "/peer/validate", body, **{PEER_HEADER: signature(b"x" * 32, "validate", body)})[0] == 403
    # signed for /mutate, posted to /validate: refused too
    assert post(decider, "/peer/validate", body, **{PEER_HEADER: signature(KEY, "mutate", body)})[0] == 403
    status, answer = post(decider, "/peer/mutate", body, **{PEER_HEADER: signature(KEY, "mutate", body)})
    assert status == 200 and answer["response"]["allowed"] is True and answer["response"]["patch"]
    # a replica that lost the lead meanwhile answers 503 instead of passing the review on
    follower = app(Lead(False, False, "https://10.0.0.6:8443"))
    handler_of(follower).peer = Relay(decider)
    status, answer = post(follower, "/peer/validate", body, **{PEER_HEADER: signature(KEY, "validate", body)})
    assert status == 503 and answer["reason"] == "ServiceUnavailable"
    assert handler_of(follower).peer.calls == []


def test_with_no_decider_to_reach_the_answer_is_503_with_the_reason() -> None:
    body = json.dumps(gpu_pod_review()).encode()
    electing = app(Lead(False, False, None))
    status, answer = post(electing, "/validate", body)
    assert status == 503 and "no GPU admission decider is elected yet" in answer["message"]
    follower = app(Lead(False, False, "https://10.0.0.5:8443"))
    handler_of(follower).peer = Relay(app(Lead(True, True, None)), fail=True)
    status, answer = post(follower, "/mutate", body)
    assert status == 503 and "did not answer" in answer["message"] and answer["kind"] == "Status"
    waiting = app(Lead(True, False, None))  # just elected: waits out its predecessor's answers
    status, answer = post(waiting, "/mutate", body)
    assert status == 503


def test_a_source_without_an_election_decides_alone() -> None:
    plain = create_app(ServerConfig(source=StaticSource(build_snapshot(cluster_objects())),
                                    namespace="gpu-admission", record_key=KEY))
    status, answer = post(plain, "/mutate", json.dumps(gpu_pod_review()).encode())
    assert status == 200 and answer["response"]["allowed"] is True
    assert handler_of(plain).peer is None
