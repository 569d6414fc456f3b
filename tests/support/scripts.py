"""The repository's scripts/ (files with dashes in their names, not modules) loaded as modules for the tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(filename: str) -> ModuleType:
    """``scripts/<filename>`` as a module (named after the file, dashes as underscores)."""
    path = SCRIPTS / filename
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
