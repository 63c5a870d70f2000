"""The sdist and wheel that `python -m build` makes, installed and run away from this checkout.

`python -m build` makes the sdist, then the wheel from the sdist, so a wheel at all proves
the sdist holds what a build needs. The wheel goes into a fresh virtual environment
without extras, as `pip install eventspool` would put it, its dependencies come from
pip's own configuration, and every command runs from a directory
outside the checkout with PYTHONPATH cleared: nothing of the checkout can stand in for a
file the wheel forgot. The build runs on a copy of the sources, so the checkout gets no
build output (egg-info, generated C).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventspool.broker import LocalBroker
from eventspool.spark.extra import INSTALL_COMMAND, MODULES
from eventspool.verify import consume_event_ids, ledger

# One worker builds and installs once for every test here.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]

REPO_ROOT = Path(__file__).resolve().parents[1]
CORE_SOURCES = ("*.pyx", "*.pxi", "*.h")
# Here about 25 s to build (the core compiles once, from the sdist) and 20 s to create the
# environment and install the wheel with its dependencies (the `spark` extra left out).
# Each fixture's steps stay under pytest's 600 s, so a stuck step fails with its output.
BUILD_TIMEOUT_S = 420
INSTALL_TIMEOUT_S = 420
RUN_TIMEOUT_S = 120
CONSUME_TIMEOUT_S = 60.0

# Run by the fresh environment's interpreter: one event through a Spool to the broker.
SEND_ONE = """
import json, sys
import eventspool
from eventspool import Spool
from eventspool._core import native

directory, bootstrap_servers, topic = sys.argv[1:]
with Spool(directory, bootstrap_servers=bootstrap_servers) as spool:
    event_id = spool.send(topic, b"from the wheel")
    unacknowledged = spool.flush(timeout=60)
print(json.dumps({
    "event_id": event_id,
    "unacknowledged": unacknowledged,
    "package": eventspool.__file__,
    "core": native.__file__,
}))
"""


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path
    output: str


@dataclass(frozen=True)
class Installed:
    venv: Path
    cwd: Path
    env: dict[str, str]

    def run(self, *command: str | Path) -> subprocess.CompletedProcess[str]:
        return _run([str(part) for part in command], self.cwd, self.env, RUN_TIMEOUT_S)


def _run(
    command: list[str], cwd: Path, env: dict[str, str] | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _copy_sources(destination: Path) -> None:
    """The checkout's top-level files and src/, without what a build or install left."""
    destination.mkdir()
    for path in REPO_ROOT.iterdir():
        if path.is_file():
            shutil.copy2(path, destination / path.name)
    shutil.copytree(
        REPO_ROOT / "src",
        destination / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.egg-info"),
    )


# Session scope: a worker may run other modules' tests between these, and a module-scoped
# fixture would then be built (half a minute) once more.
@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("build")
    _copy_sources(root / "source")
    # At -O0 (setup.py leaves out its -O2 when CFLAGS names a level): the compile is a
    # quarter of the time, and what this file proves is the packaging, not the code.
    done = _run(
        [sys.executable, "-m", "build", "--outdir", str(root / "dist"), str(root / "source")],
        root,
        {**os.environ, "CFLAGS": "-O0"},
        BUILD_TIMEOUT_S,
    )
    (sdist,) = (root / "dist").glob("*.tar.gz")
    (wheel,) = (root / "dist").glob("*.whl")
    return Built(sdist, wheel, done.stdout + done.stderr)


@pytest.fixture(scope="session")
def installed(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    assert not root.is_relative_to(REPO_ROOT)
    venv = root / "venv"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    _run([sys.executable, "-m", "venv", str(venv)], root, env, RUN_TIMEOUT_S)
    _run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", str(built.wheel)],
        root,
        env,
        INSTALL_TIMEOUT_S,
    )
    return Installed(venv, root, env)


def test_the_build_warns_of_nothing_deprecated(built: Built) -> None:
    """A TOML table as `project.license` was deprecated; the SPDX string is not."""
    assert "deprecated" not in built.output.lower(), built.output


def test_the_sdist_holds_the_core_sources(built: Built) -> None:
    core = REPO_ROOT / "src" / "eventspool" / "_core"
    wanted = {path.name for pattern in CORE_SOURCES for path in core.glob(pattern)}
    assert "native.pyx" in wanted
    with tarfile.open(built.sdist) as sdist:
        names = {Path(name).name for name in sdist.getnames() if "/_core/" in name}
    assert wanted <= names, f"missing from the sdist: {sorted(wanted - names)}"


def test_the_wheel_holds_the_compiled_core_and_its_types(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as wheel:
        names = set(wheel.namelist())
        metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
        fields = wheel.read(metadata).decode()
    assert any(
        name.startswith("eventspool/_core/native.") and name.endswith(".so") for name in names
    )
    assert {"eventspool/py.typed", "eventspool/_core/native.pyi"} <= names
    assert "eventspool/_core/native.c" not in names  # generated, compiled, not shipped
    assert "License-Expression: Apache-2.0" in fields


def test_the_spark_stack_is_an_extra(built: Built) -> None:
    """PySpark, PyArrow and psycopg (hundreds of MB) come only with `eventspool[spark]`."""
    with zipfile.ZipFile(built.wheel) as wheel:
        metadata = next(name for name in wheel.namelist() if name.endswith(".dist-info/METADATA"))
        fields = wheel.read(metadata).decode()
    requires = [
        line.removeprefix("Requires-Dist:").strip()
        for line in fields.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert "Provides-Extra: spark" in fields
    for package in MODULES:
        found = [line for line in requires if line.startswith(package)]
        assert found, f"{package} is not a dependency at all: {requires}"
        unconditional = [line for line in found if 'extra == "spark"' not in line]
        assert not unconditional, f"{package} is not left to the spark extra: {unconditional}"


def test_the_installed_package_runs_without_spark(installed: Installed) -> None:
    """Without the extra, the pipeline command says how to install it, and nothing else
    of the package needs it (the other tests here send and run commands without it)."""
    present = installed.run(
        installed.venv / "bin" / "python",
        "-c",
        f"import importlib.util as u; print([m for m in {MODULES!r} if u.find_spec(m)])",
    )
    assert present.stdout.strip() == "[]"
    command = [str(installed.venv / "bin" / "eventspool"), "pipeline", "run", "--local-db"]
    command += ["--bootstrap-servers", "127.0.0.1:9", "--topic", "t", "--output", "out"]
    done = subprocess.run(
        command,
        cwd=installed.cwd,
        env=installed.env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert INSTALL_COMMAND in done.stderr


def test_the_installed_command_answers(installed: Installed) -> None:
    version = installed.run(installed.venv / "bin" / "eventspool", "--version")
    assert "0.1.0" in version.stdout
    agent = installed.run(installed.venv / "bin" / "eventspool", "agent", "--help")
    assert "--config" in agent.stdout


def test_the_installed_library_sends_to_the_broker(
    installed: Installed, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(1)
    done = installed.run(
        installed.venv / "bin" / "python",
        "-c",
        SEND_ONE,
        installed.cwd / "spool",
        broker.bootstrap_servers,
        topic,
    )
    sent = json.loads(done.stdout.splitlines()[-1])
    # The package and its compiled core came from the fresh environment, not the checkout.
    for module in (sent["package"], sent["core"]):
        assert Path(module).is_relative_to(installed.venv), module
    assert sent["unacknowledged"] == 0
    seen = consume_event_ids(
        broker.bootstrap_servers, [topic], [sent["event_id"]], timeout=CONSUME_TIMEOUT_S
    )
    assert ledger([sent["event_id"]], seen).delivered == 1
