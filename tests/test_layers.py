"""The package's layers: every module imports only from the layers below its own (the import-linter contract in
setup.cfg), checked on the installed layout, where frontend/, schedules/, autotune/ and benchmarks/ sit inside cinn/."""
from __future__ import annotations

import configparser
import os
import pathlib
import shutil
import subprocess
import sys

from tests.timeouts import scaled

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _installed_layout(dest: pathlib.Path) -> pathlib.Path:
    """Copy the package as setup.cfg's package_dir installs it (import-linter reads the files under cinn/)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    mapping = dict(line.split("=") for line in cfg["options"]["package_dir"].strip().splitlines())
    for package, folder in sorted((k.strip(), v.strip()) for k, v in mapping.items()):
        shutil.copytree(ROOT / folder, dest.joinpath(*package.split(".")), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_imports_follow_the_layers(tmp_path):
    layout = _installed_layout(tmp_path / "site")
    env = dict(os.environ, PYTHONPATH=str(layout))
    lint = pathlib.Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), str(ROOT / "setup.cfg")], cwd=layout, env=env, capture_output=True,
                          text=True, timeout=scaled(300))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout


def test_the_layout_holds_every_module(tmp_path):
    """The contract sees the whole package: each subpackage folder lands inside cinn/."""
    layout = _installed_layout(tmp_path / "site")
    for sub in ("frontend", "frontend/onnx", "frontend/paddle", "schedules", "autotune", "benchmarks", "ops", "passes"):
        assert (layout / "cinn" / sub / "__init__.py").is_file(), sub
