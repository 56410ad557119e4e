"""examples/spot_notice.py against a fake instance metadata service served here on 127.0.0.1: AWS's (IMDSv2 token
required, 404 until a notice, then the action and its time) and GCP's (``Metadata-Flavor: Google`` required, FALSE
until preempted). Its drain of a real Ray node is tested on the cluster (tests/cluster/test_spot_notice.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spot_notice", ROOT / "examples/spot_notice.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


spot_notice = load_example()


class FakeMetadata:
    """What the fake service answers: ``aws_notice`` (None: 404), ``gcp_preempted``, the IMDSv2 tokens it issued
    (``expire_tokens`` forgets them: the next request with one gets 401), and every request seen."""

    def __init__(self) -> None:
        self.aws_notice: dict | None = None
        self.gcp_preempted = False
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str]] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def answer(self, code: int, body: str = "") -> None:
                self.send_response(code)
                self.end_headers()
                self.wfile.write(body.encode())

            def do_PUT(self) -> None:  # noqa: N802
                fake.requests.append(("PUT", self.path))
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self.answer(400)
                token = f"token-{len(fake.tokens)}"
                fake.tokens.add(token)
                return self.answer(200, token)

            def do_GET(self) -> None:  # noqa: N802
                fake.requests.append(("GET", self.path))
                if self.path == "/latest/meta-data/spot/instance-action":
                    if self.headers.get("X-aws-ec2-metadata-token") not in fake.tokens:
                        return self.answer(401)
                    return (
                        self.answer(404) if fake.aws_notice is None else self.answer(200, json.dumps(fake.aws_notice))
                    )
                if self.path == "/computeMetadata/v1/instance/preempted":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self.answer(403)
                    return self.answer(200, "TRUE" if fake.gcp_preempted else "FALSE")
                return self.answer(404)

        return Handler


@pytest.fixture
def metadata() -> Iterator[tuple[FakeMetadata, str]]:
    fake = FakeMetadata()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def aws(base: str) -> object:
    return spot_notice.provider(
        "aws", f"{base}/latest/meta-data/spot/instance-action", f"{base}/latest/api/token", notice_s=30
    )


def test_aws_no_notice_until_the_instance_action_then_its_time(metadata: tuple[FakeMetadata, str]) -> None:
    fake, base = metadata
    cloud = aws(base)
    assert cloud.deadline(time.time()) is None
    assert cloud.deadline(time.time()) is None
    assert [r for r in fake.requests if r[0] == "PUT"] == [("PUT", "/latest/api/token")]  # one token, kept
    fake.aws_notice = {"action": "terminate", "time": "2026-11-29T05:00:00Z"}
    assert cloud.deadline(time.time()) == datetime(2026, 11, 29, 5, 0, tzinfo=UTC).timestamp()


def test_aws_an_expired_token_is_renewed(metadata: tuple[FakeMetadata, str]) -> None:
    fake, base = metadata
    cloud = aws(base)
    assert cloud.deadline(time.time()) is None
    fake.tokens.clear()  # the token expired: the next GET is refused (401)
    fake.aws_notice = {"action": "stop", "time": "2026-11-29T05:00:00Z"}
    assert cloud.deadline(time.time()) is not None
    assert len([r for r in fake.requests if r[0] == "PUT"]) == 2


def test_gcp_preempted_gives_its_notice_from_now(metadata: tuple[FakeMetadata, str]) -> None:
    fake, base = metadata
    cloud = spot_notice.provider("gcp", f"{base}/computeMetadata/v1/instance/preempted", notice_s=30)
    assert cloud.deadline(1000.0) is None
    fake.gcp_preempted = True
    assert cloud.deadline(1000.0) == 1030.0


def test_the_drain_is_for_preemption_never_past_the_deadline() -> None:
    command = spot_notice.drain_command("10.0.0.1:6379", deadline=1119.6, now=1000.0, node_id=None, reason="aws")
    assert command[:2] == ["ray", "drain-node"]
    assert command[command.index("--reason") + 1] == "DRAIN_NODE_REASON_PREEMPTION"
    assert command[command.index("--deadline-remaining-seconds") + 1] == "119"
    assert command[command.index("--address") + 1] == "10.0.0.1:6379" and "--node-id" not in command
    with_node = spot_notice.drain_command("h:1", deadline=1000.2, now=1000.0, node_id="ab" * 28, reason="gcp")
    assert with_node[-2:] == ["--node-id", "ab" * 28]
    assert with_node[with_node.index("--deadline-remaining-seconds") + 1] == "1"


def test_an_unreachable_metadata_service_is_asked_again(metadata: tuple[FakeMetadata, str], monkeypatch) -> None:
    """The watch survives failed requests (the service down a moment) and drains on the notice, with the token file
    handed to ``ray drain-node``; ``ray`` itself is replaced by a recorder (its drain is tested on the cluster)."""
    fake, base = metadata
    cloud = spot_notice.provider("gcp", f"{base}/computeMetadata/v1/instance/preempted", notice_s=30)
    good, calls, ran = cloud.url, [], []
    cloud.url = "http://127.0.0.1:1/unreachable"

    def deadline_then_recover(now: float) -> float | None:
        calls.append(now)
        cloud.url = good if len(calls) > 1 else cloud.url  # the first request fails, the second finds no notice
        fake.gcp_preempted = len(calls) > 2
        return real(now)

    real = cloud.deadline
    monkeypatch.setattr(cloud, "deadline", deadline_then_recover)
    monkeypatch.setattr(spot_notice.subprocess, "run", lambda command, env, **_: ran.append((command, env)))
    deadline = spot_notice.watch(cloud, "127.0.0.1:6379", poll_s=0.01, ray_token_file="/tmp/token", clock=lambda: 50.0)
    assert deadline == 80.0 and len(calls) == 3
    [(command, env)] = ran
    assert command[command.index("--deadline-remaining-seconds") + 1] == "30"
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == "/tmp/token"


def test_an_unknown_provider_is_named() -> None:
    with pytest.raises(ValueError, match="--provider: 'azure'"):
        spot_notice.provider("azure")
