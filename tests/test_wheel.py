"""geryon as a user gets it: a wheel, installed (not editable) into a fresh venv, used from another directory.

The wheel is built from a copy of the working tree; the fresh venv sees this project's venv's packages
(torch, numpy, ...) through a .pth line, so nothing is downloaded, but not its editable geryon: the geryon
that runs is the wheel's, with its packaged profiles and demo script, and no ../shared anywhere.
"""

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_COPY_IGNORE = shutil.ignore_patterns(".venv", ".git", "__pycache__", "build", "dist", "*.egg-info",
                                      ".pytest_cache", ".hypothesis", ".import_linter_cache", ".ruff_cache",
                                      "runs", "out")

pytestmark = pytest.mark.slow

# the installed wheel's declared dependency ranges are met by what the fresh venv sees
_CHECK_REQUIREMENTS = """
from importlib import metadata
from packaging.requirements import Requirement
unmet = []
for text in metadata.requires("geryon"):
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        version = None
    if version is None or not req.specifier.contains(version, prereleases=True):
        unmet.append(f"{req} (found {version})")
assert not unmet, unmet
"""


def _run(argv, **kw):
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    assert result.returncode == 0, f"{argv}: {result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def _env() -> dict[str, str]:
    """No PYTHONPATH, no rank or geryon variables: what a user's shell has."""
    return {k: v for k, v in os.environ.items()
            if k != "PYTHONPATH" and not k.startswith("GERYON_")
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """(python, geryon) of a fresh venv with geryon installed from its wheel."""
    root = tmp_path_factory.mktemp("wheel")
    source, dist, venv = root / "src", root / "dist", root / "venv"
    shutil.copytree(REPO, source, ignore=_COPY_IGNORE)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, source],
         timeout=300, env=_env())
    wheels = list(dist.glob("geryon-*.whl"))
    assert len(wheels) == 1, wheels
    # no pip or setuptools of its own (3.11's would shadow the newer setuptools torch requires):
    # this venv's pip installs into it with --python
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--system-site-packages",
          "--without-pip", venv], timeout=300)
    python = venv / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    (Path(purelib) / "project-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # --force-reinstall: the project venv's editable geryon is visible through the .pth line too
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index", "--no-deps",
          "--force-reinstall", wheels[0]], timeout=300, env=_env())
    _run([python, "-c", _CHECK_REQUIREMENTS], cwd=root, env=_env(), timeout=60)
    return python, venv / "bin" / "geryon"


def test_wheel_has_the_profiles_and_the_demo_script(venv, tmp_path):
    python, _geryon = venv
    code = ("import geryon, geryon.examples as e, geryon.categorize.profiles as p; "
            "print(geryon.__file__); print(p.profiles_dir()); print(e.script('train_cnn'))")
    lines = _run([python, "-c", code], cwd=tmp_path, env=_env()).stdout.split()
    assert all("site-packages" in line and str(REPO) not in line for line in lines), lines
    assert Path(lines[1], "VGG19_gpu_bs32.dag").is_file() and Path(lines[2]).is_file()


def test_categorize_vgg19_from_another_directory(venv, tmp_path):
    _python, geryon = venv
    out = _run([geryon, "categorize", "vgg19", "--json"], cwd=tmp_path, env=_env(), timeout=120).stdout
    data = json.loads(out)
    assert len(data["ranking"]) == 19 and data["assignment"]["method"] == "coarse"


@pytest.mark.root
def test_short_demo_from_another_directory(venv, tmp_path):
    _python, geryon = venv
    result = _run([geryon, "demo", "--iterations", "2", "--hidden", "256", "--workers", "2", "--servers", "1",
                   "--runs", "ps", "--json"], cwd=tmp_path, env=_env(), timeout=300)
    runs = json.loads(result.stdout)["runs"]
    assert [r["run"] for r in runs] == ["geryon PS"] and runs[0]["iterations"] == 2
