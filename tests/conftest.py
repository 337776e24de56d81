"""Shared fixtures: root detection and unique names for resources a test creates."""

import os
import uuid

import pytest


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (network namespaces and tc)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def unique_name():
    """A short unique run name (≤ 6 chars) so parallel tests never share namespaces."""
    return "t" + uuid.uuid4().hex[:5]
