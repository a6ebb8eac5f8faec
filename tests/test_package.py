"""scalesgd is a real package: `python -m build` makes an sdist and, from it, a wheel of the package alone; the
wheel installed in a fresh venv with only its runtime dependencies gives a `scalesgd` command that works from
any folder and imports the installed copy, not this tree.

The build runs on a copy of the files a clone has, so its egg-info and build/ never land in this tree, which other
processes may be importing from. It runs without isolation where this environment has the setuptools that
pyproject's build-system asks for (offline, ~2 s); elsewhere isolated (setuptools fetched from the index).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IGNORED = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "runs", ".pytest_cache", ".hypothesis")


def _clean_env() -> dict[str, str]:
    """The environment for the fresh venv's processes: nothing that would put this tree or a user's site-packages on
    their path; bytecode written, so the second process reads what the first compiled (9 s of torch's tree)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _copy_of_clone(dst: Path) -> Path:
    """The files a clone of this tree has (tracked and new, none ignored), copied to `dst`."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):  # no git, or not a checkout: the tree less what git ignores
        shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(*IGNORED))
        return dst
    for name in filter(None, listed):
        if (ROOT / name).is_file():  # --cached lists files deleted from the working tree too
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    return dst


def _can_build_offline() -> bool:
    """Whether this environment has the setuptools pyproject's build-system requires (then no isolated env is needed)."""
    wanted = re.search(r'"setuptools>=(\d+)', (ROOT / "pyproject.toml").read_text())
    try:
        have = int(metadata.version("setuptools").split(".")[0])
    except metadata.PackageNotFoundError:
        return False
    return wanted is None or have >= int(wanted.group(1))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """`python -m build` on a copy of the clone: the sdist, then the wheel built from that sdist."""
    source = _copy_of_clone(tmp_path_factory.mktemp("source") / "scalesgd")
    out = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "build", "--outdir", str(out)]
    if _can_build_offline():
        cmd.append("--no-isolation")
    start = time.perf_counter()
    _run([*cmd, str(source)], timeout=600)
    took = time.perf_counter() - start
    wheels, sdists = sorted(out.glob("scalesgd-*.whl")), sorted(out.glob("scalesgd-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    print(f"\nbuild ({'no isolation' if '--no-isolation' in cmd else 'isolated'}): {took:.1f} s")
    return {"source": source, "wheel": wheels[0], "sdist": sdists[0]}


def _runtime_and_test_requirements(wheel: Path) -> tuple[set[str], set[str]]:
    """The distribution names the wheel requires at run time, and those only its `test` extra adds (the `peers`
    extra, the libraries compared against, is neither)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    runtime, test = set(), set()
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:"):
            spec = line.split(":", 1)[1].strip()
            name = re.match(r"[A-Za-z0-9._-]+", spec).group(0).lower().replace("_", "-")
            extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", spec)
            if extra is None:
                runtime.add(name)
            elif extra.group(1) == "test":
                test.add(name)  # the other extras (peers) are neither
    return runtime, test


def test_the_wheel_holds_the_package_alone_and_the_sdist_what_building_needs(built):
    source, wheel, sdist = built["source"], built["wheel"], built["sdist"]
    version = wheel.name.split("-")[1]

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = zf.read(f"scalesgd-{version}.dist-info/entry_points.txt").decode()
        meta = zf.read(f"scalesgd-{version}.dist-info/METADATA").decode()
    modules = {n for n in names if n.endswith(".py")}
    in_tree = {p.relative_to(source / "src").as_posix() for p in (source / "src" / "scalesgd").rglob("*.py")}
    assert modules == in_tree, f"in the tree, not the wheel: {sorted(in_tree - modules)}; the reverse: {sorted(modules - in_tree)}"
    for needed in ("scalesgd/__init__.py", "scalesgd/__main__.py", "scalesgd/cli.py", "scalesgd/comm/engine/optimizer.py",
                   "scalesgd/comm/engine/ddp_hook.py"):
        assert needed in names
    strays = [n for n in names if not n.startswith(("scalesgd/", f"scalesgd-{version}.dist-info/"))]
    assert not strays, f"the wheel holds more than the package: {strays}"
    assert not [n for n in names if "tests/" in n or n.startswith("tests")]
    assert re.search(r"^scalesgd\s*=\s*scalesgd\.cli:main$", entry_points, re.M), entry_points
    assert "License-Expression: Apache-2.0" in meta and f"scalesgd-{version}.dist-info/licenses/LICENSE" in names

    with tarfile.open(sdist) as tf:
        members = {m.name for m in tf.getmembers()}
    top = f"scalesgd-{version}"
    for needed in ("pyproject.toml", "README.md", "LICENSE", "PKG-INFO", "src/scalesgd/__init__.py",
                   "src/scalesgd/cli.py"):
        assert f"{top}/{needed}" in members, f"the sdist lacks {needed}"
    assert not [m for m in members if m.startswith(f"{top}/tests")], "the sdist carries part of the test suite"


def test_the_wheel_in_a_fresh_venv_runs_from_anywhere_with_only_its_runtime_dependencies(built, tmp_path):
    """A fresh venv gets torch (this environment's version: the same build, from pip's cache or the local wheel, never
    a multi-GB other one), then the wheel with its runtime dependencies (no extras). This environment's pip does the
    installing (pip ≥ 22.3 `--python`), so the venv needs no pip of its own; `--no-compile` skips byte-compiling
    torch's tree (tens of seconds) for the two processes that run here."""
    from scalesgd.cli import build_parser

    env, times = _clean_env(), {}
    venv_dir, cwd = tmp_path / "venv", tmp_path / "elsewhere"
    cwd.mkdir()
    pip_version = tuple(int(x) for x in re.findall(r"\d+", metadata.version("pip"))[:2])
    own_pip = pip_version < (22, 3)

    start = time.perf_counter()
    _run([sys.executable, "-m", "venv", *([] if own_pip else ["--without-pip"]), str(venv_dir)], timeout=300, env=env)
    python = venv_dir / "bin" / "python"
    pip = [str(python), "-m", "pip"] if own_pip else [sys.executable, "-m", "pip", "--python", str(python)]
    pip_install = [*pip, "install", "--no-compile", "--disable-pip-version-check", "--no-input"]
    times["venv"] = time.perf_counter() - start

    start = time.perf_counter()
    _run([*pip_install, f"torch=={metadata.version('torch')}"], timeout=1200, env=env, cwd=cwd)
    times["torch"] = time.perf_counter() - start

    start = time.perf_counter()
    _run([*pip_install, str(built["wheel"])], timeout=1200, env=env, cwd=cwd)
    times["wheel and its dependencies"] = time.perf_counter() - start

    start = time.perf_counter()
    proc = _run([str(venv_dir / "bin" / "scalesgd"), "--help"], timeout=300, env=env, cwd=cwd)
    times["scalesgd --help"] = time.perf_counter() - start
    commands = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert proc.stdout.startswith("usage: scalesgd")
    for command in commands:
        assert command in proc.stdout, f"`scalesgd --help` does not show {command}:\n{proc.stdout}"

    probe = ("import importlib.metadata as m, importlib.util as u, json, scalesgd\n"
             "print(json.dumps({'file': scalesgd.__file__, 'version': scalesgd.__version__,"
             " 'dists': sorted(d.metadata['Name'].lower().replace('_', '-') for d in m.distributions()),"
             " 'modules': {n: u.find_spec(n) is not None for n in ('pytest', 'hypothesis')}}))")
    start = time.perf_counter()
    found = json.loads(_run([str(python), "-c", probe], timeout=300, env=env, cwd=cwd).stdout)
    times["import scalesgd"] = time.perf_counter() - start
    print("\nfresh venv: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))

    where = Path(found["file"]).resolve()
    assert where.is_relative_to(venv_dir.resolve()) and "site-packages" in where.parts, where
    assert not where.is_relative_to(ROOT)
    assert found["version"] == built["wheel"].name.split("-")[1]
    runtime, test_only = _runtime_and_test_requirements(built["wheel"])
    assert runtime <= set(found["dists"]), f"runtime dependencies missing: {runtime - set(found['dists'])}"
    assert not test_only & set(found["dists"]), f"test extras installed: {test_only & set(found['dists'])}"
    assert found["modules"] == {"pytest": False, "hypothesis": False}
