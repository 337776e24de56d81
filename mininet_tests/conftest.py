"""Mininet tests need root and the Debian mininet package; skip them (with the reason) otherwise."""

import importlib.util
import os

import pytest


def pytest_collection_modifyitems(config, items):
    reason = None
    if os.geteuid() != 0:
        reason = "needs root (Mininet)"
    elif importlib.util.find_spec("mininet") is None:
        reason = "Mininet is not installed (Debian package mininet; run scripts/setup.sh)"
    if reason is None:
        return
    for item in items:
        if "mininet_tests" in str(item.path):
            item.add_marker(pytest.mark.skip(reason=reason))
