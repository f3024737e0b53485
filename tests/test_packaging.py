"""The distribution as a user installs it: one top-level package, `cinn`, from a built wheel, without the repository."""
from __future__ import annotations

import os
import pathlib
import site
import subprocess
import sys

import pytest

import cinn
from tests.timeouts import scaled

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = ("cinn-run", "cinn-tune", "cinn-bench")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> pathlib.Path:
    """A fresh virtual environment holding the wheel built from this checkout (its dependencies are this test
    environment's, listed as a plain path: the editable install's finder there is never run)."""
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(ROOT)],
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


def test_the_wheel_installs_one_top_level_package(installed, tmp_path):
    code = (
        "import importlib, pathlib, sys\n"
        "import cinn, cinn.frontend, cinn.schedules, cinn.autotune, cinn.benchmarks\n"
        f"assert pathlib.Path(cinn.__file__).is_relative_to({str(installed)!r}), cinn.__file__\n"
        f"assert not pathlib.Path(cinn.frontend.__file__).is_relative_to({str(ROOT)!r})\n"
        "assert (pathlib.Path(cinn.__file__).parent / 'thread_pool.c').is_file()  # the thread pool's source\n"
        "for name in ('frontend', 'schedules', 'autotune', 'benchmarks'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError:\n"
        "        continue\n"
        "    sys.exit(f'top-level {name} imports')\n"
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
