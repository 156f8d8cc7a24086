"""The public names: everything in `bertforge.__all__` exists, and the README's imports work."""

from __future__ import annotations

import re
from pathlib import Path

import bertforge


def test_all_names_exist():
    for name in bertforge.__all__:
        assert hasattr(bertforge, name), name


def test_readme_imports_work():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    imports = re.findall(r"^from (bertforge[\w.]*) import ([\w, ]+)$", readme, flags=re.MULTILINE)
    assert imports, "the README shows no imports"
    for module, names in imports:
        namespace: dict = {}
        exec(f"from {module} import {names}", namespace)  # noqa: S102 - the README's own lines
