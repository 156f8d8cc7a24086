"""The public names: everything in `bertforge.__all__` exists, and the imports the README and the guide show work."""

from __future__ import annotations

import re
from pathlib import Path

import bertforge


def test_all_names_exist():
    for name in bertforge.__all__:
        assert hasattr(bertforge, name), name


def test_docs_imports_work():
    repo = Path(__file__).resolve().parents[1]
    pages = [repo / "README.md", *sorted((repo / "docs" / "guide").glob("*.md"))]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    imports = re.findall(r"^(?:from (bertforge[\w.]*) import ([\w, ]+)|import (bertforge[\w.]*))$", text,
                         flags=re.MULTILINE)
    assert imports, "the docs show no imports"
    for module, names, whole in imports:
        namespace: dict = {}
        line = f"from {module} import {names}" if module else f"import {whole}"
        exec(line, namespace)  # noqa: S102 - the docs' own lines
