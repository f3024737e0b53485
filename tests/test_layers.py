"""The package's layers: every module imports only from the layers below its own (the import-linter contracts in
setup.cfg), checked on the checkout as it is."""
from __future__ import annotations

import configparser
import pathlib
import subprocess
import sys

from tests.timeouts import scaled

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _contracts() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return [s for s in cfg.sections() if s.startswith("importlinter:contract:")]


def test_imports_follow_the_layers():
    lint = pathlib.Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--config", str(ROOT / "setup.cfg")], cwd=ROOT, capture_output=True,
                          text=True, timeout=scaled(300))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(_contracts())} kept, 0 broken" in proc.stdout


def test_every_package_folder_is_in_a_layer():
    """The folder contract names every package the checkout installs, and cinn/ holds nothing but its layers."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    layers = cfg["importlinter:contract:folders"]["layers"]
    named = {name.strip() for line in layers.split("\n") for name in line.split("|") if name.strip()}
    roots = cfg["importlinter"]["root_packages"].split()
    inner = {f"cinn.{p.parent.name}" for p in (ROOT / "cinn").glob("*/__init__.py")}
    assert named == (set(roots) - {"cinn"}) | inner
    assert sorted(p.name for p in (ROOT / "cinn").glob("*.py")) == ["__init__.py", "__main__.py"]
