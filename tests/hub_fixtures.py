"""Fixtures for the hub tests: a fake hub on localhost and an isolated HF cache."""

from __future__ import annotations

import pytest
from hub_fake_server import FakeHub
from huggingface_hub import constants

GGUF = b"GGUF\x03\x00\x00\x00"


def gguf_bytes(label: str, size: int = 4096) -> bytes:
    """Small deterministic fake weights with the GGUF magic."""
    body = (label.encode() * (size // max(len(label), 1) + 1))[: size - len(GGUF)]
    return GGUF + body


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """HF cache, token and user config all under tmp_path; no token, not offline."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


@pytest.fixture
def fake_hub(isolated, monkeypatch):
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub
