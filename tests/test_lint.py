"""The code base's own rules, checked on every test run: ruff, and the one-way import rule (import-linter).

Both read their configuration from pyproject.toml ([tool.ruff], [tool.importlinter]); both come with the
`test` extra.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    if not path:
        pytest.fail(f"{name} is not installed: `pip install -e '.[test]'` (scripts/setup.sh does it)")
    return str(path)


def test_ruff_is_clean():
    result = subprocess.run([_tool("ruff"), "check", "--no-cache", "."], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_contracts_hold():
    result = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
