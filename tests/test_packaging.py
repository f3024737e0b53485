"""The distribution as a user installs it, from a built wheel, without the repository: `cinn` and the user's folders
(frontend, schedules, autotune, benchmarks), each a package."""
from __future__ import annotations

import os
import pathlib
import shutil
import site
import subprocess
import sys

import pytest

import cinn
from tests.timeouts import scaled

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = ("cinn-run", "cinn-tune", "cinn-bench", "cinn-quantize")
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "cinn", "frontend", "schedules", "autotune", "benchmarks")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> pathlib.Path:
    """A fresh virtual environment holding the wheel built from this checkout (its dependencies are this test
    environment's, listed as a plain path: the editable install's finder there is never run)."""
    tmp = tmp_path_factory.mktemp("wheel")
    dist, source = tmp / "dist", tmp / "source"
    # built from a copy: setuptools writes build/ in the tree it builds, and each test worker builds its own wheel
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(source)],
                   check=True, timeout=scaled(600))
    (wheel,) = dist.glob("cinn-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=scaled(120))
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(wheel)],
                   check=True, timeout=scaled(600))
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (pathlib.Path(purelib) / "test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv


def _run(venv: pathlib.Path, *argv: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=scaled(300), cwd=cwd, env=env)


def test_the_wheel_installs_the_folders_as_packages(installed, tmp_path):
    code = (
        "import pathlib\n"
        "import cinn, frontend, schedules, autotune, benchmarks\n"
        "for module in (cinn, frontend, schedules, autotune, benchmarks):\n"
        f"    assert pathlib.Path(module.__file__).is_relative_to({str(installed)!r}), module.__file__\n"
        "import cinn.runtime\n"
        "assert (pathlib.Path(cinn.runtime.__file__).parent / 'thread_pool.c').is_file()  # the thread pool's source\n"
        "from cinn import NetBuilder\n"
        "b = NetBuilder('p'); x = b.create_input('float32', (2,), 'x'); b.build([b.relu(x)])\n"
        "print(cinn.__version__)\n"
    )
    proc = _run(installed, str(installed / "bin" / "python"), "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == cinn.__version__


@pytest.mark.parametrize("script", SCRIPTS)
def test_console_scripts_answer_help_and_version(installed, tmp_path, script):
    for flag in ("--help", "--version"):
        proc = _run(installed, str(installed / "bin" / script), flag, cwd=tmp_path)
        assert proc.returncode == 0, f"{script} {flag}: {proc.stdout}{proc.stderr}"
        assert (script in proc.stdout) if flag == "--help" else (cinn.__version__ in proc.stdout)
