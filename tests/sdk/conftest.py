"""Fixtures for the SDK compatibility tests. tests/sdk/run.py starts the server and sets
OFFSHOOT_SDK_BASE_URL, OFFSHOOT_SDK_API_KEY and OFFSHOOT_SDK_API_SECRET."""

from __future__ import annotations

import os
import uuid

import pytest


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run these tests through tests/sdk/run.py (scripts/test does)")
    return value


@pytest.fixture(scope="session")
def server() -> dict:
    return {
        "base_url": _env("OFFSHOOT_SDK_BASE_URL"),
        "api_key": _env("OFFSHOOT_SDK_API_KEY"),
        "api_secret": _env("OFFSHOOT_SDK_API_SECRET"),
    }


@pytest.fixture
def uid():
    """Unique ids, so tests never see each other's users and channels."""
    suffix = uuid.uuid4().hex[:10]
    return lambda name: f"{name}-{suffix}"


def copy_id(fork_cid: str, source_message_id: str) -> str:
    """The documented copy-id formula (README, "Copy ids")."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"offshoot:fork:{fork_cid}:{source_message_id}"))
