"""Attaching to a cluster, on its own: address parsing, where the token comes from, the driver's environment, a cluster
that does not answer, the code shipped (the real two-node cluster runs them end to end in tests/cluster)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from pipeline.config import parse_params
from pipeline.sweep import session

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(autouse=True)
def environment_put_back() -> Iterator[None]:
    """``prepare_driver_env`` sets variables in ``os.environ`` itself (``RAY_AUTH_MODE``, the loopback variable);
    left behind, they change how a later test's in-process Ray starts (its GCS then refused the test's own client)."""
    with mock.patch.dict(os.environ):
        yield


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:6379", ("127.0.0.1", 6379)),
        ("head.example:6380", ("head.example", 6380)),
        ("[::1]:6379", ("::1", 6379)),
        ("auto", None),
        ("ray://head:10001", None),
    ],
)
def test_gcs_address_is_host_and_port(address: str, expected: tuple | None) -> None:
    assert session.gcs_host_port(address) == expected


@pytest.mark.parametrize("address", ["head", "head:port", ":6379"])
def test_an_address_without_a_port_names_the_key(address: str) -> None:
    with pytest.raises(ValueError, match=r"^sweep.ray_address: .* is not host:port"):
        session.gcs_host_port(address)


def test_token_is_looked_up_in_rays_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    assert session.auth_token_source() is None
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray/auth_token").write_text("t")
    assert session.auth_token_source() == "~/.ray/auth_token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/somewhere/token")
    assert session.auth_token_source() == "$RAY_AUTH_TOKEN_PATH (/somewhere/token)"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "secret")
    assert session.auth_token_source() == "$RAY_AUTH_TOKEN"


@pytest.mark.parametrize(
    ("address", "token", "mode", "loopback"),
    [
        ("127.0.0.1:6379", "x", "token", "0"),
        ("localhost:6379", None, None, "0"),
        ("10.0.0.5:6379", "x", "token", None),
        (None, "x", None, "0"),
    ],
)
def test_driver_env_for_the_address(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    address: str | None,
    token: str | None,
    mode: str | None,
    loopback: str | None,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    if token:
        monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    else:
        monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    sweep = parse_params({"sweep": {"ray_address": address}}, "test").sweep
    session.prepare_driver_env(sweep)
    assert os.environ.get("RAY_AUTH_MODE") == mode
    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == loopback


def test_users_auth_mode_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "x")
    session.prepare_driver_env(parse_params({"sweep": {"ray_address": "10.0.0.5:6379"}}, "test").sweep)
    assert os.environ["RAY_AUTH_MODE"] == "disabled"


def test_nothing_listening_fails_at_once_naming_the_key() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(ValueError, match=r"^sweep.ray_address: cannot attach to the Ray cluster at 127.0.0.1:"):
            session.check_attachable(f"127.0.0.1:{port}", timeout_s=2)


def test_the_shipped_code_is_this_checkout() -> None:
    assert session.code_runtime_env(ROOT) == {"working_dir": str(ROOT)}
    assert ".git" in (ROOT / ".rayignore").read_text().split()  # the upload leaves history and stores out
