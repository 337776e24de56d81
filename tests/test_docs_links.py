"""Every link in the README and the docs leads somewhere, and every docs page the code names exists.

A relative Markdown link must name a file of the repository (and, with `#anchor`, a heading of that
page, as GitHub makes anchors); a `docs/...` path in a module, test or script must exist.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS_PATH = re.compile(r"\bdocs/[\w./-]+\.(?:md|png|json|jsonl)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings."""
    found = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def test_docs_paths_named_in_code_exist():
    missing = []
    for source in [*(ROOT / "geryon").rglob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "scripts").glob("*")]:
        if source.name == Path(__file__).name or not source.is_file():
            continue
        for path in DOCS_PATH.findall(source.read_text(errors="replace")):
            if not (ROOT / path).exists():
                missing.append(f"{source.relative_to(ROOT)}: {path}")
    assert not missing, "docs paths named in code that do not exist:\n" + "\n".join(missing)
