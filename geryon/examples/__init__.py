"""Training scripts shipped with geryon, runnable from any directory.

  train_cnn  a small CNN on a generated 10-class image set (what `geryon demo` trains); run it with
             `python -m geryon.launch ... $(python -c 'import geryon.examples as e; print(e.script("train_cnn"))')`
             or through the copy in the repository's examples/ folder
"""

from importlib import resources
from pathlib import Path


def script(name: str) -> Path:
    """The file path of a shipped example script (the launcher runs scripts by path)."""
    return Path(str(resources.files(__name__) / f"{name}.py"))
