"""The compiled core under AddressSanitizer and UndefinedBehaviorSanitizer.

The test copies the package into a temporary directory, builds eventspool._core.native
there with the project's own setup.py plus the sanitizer flags, and runs a short set of
the tests that drive the core (envelopes, the ring, the partitioner, the agent's
intake, the consumer's hand-over, the blocking client's call in person and its lane) in a child
process whose PYTHONPATH puts that copy first. A buffer overrun, a use after free or
undefined behaviour in the compiled code then stops the child with a sanitizer report,
and this test fails with that report in its message.

Nothing here imports from the temporary directory: only the child processes do. Three
checks keep the run honest: the built module's imports name the sanitizer runtimes
(the code is instrumented), a child that overruns a malloc'd block on purpose is stopped
with an AddressSanitizer report (the runtime is loaded and its reports reach us), and a
plugin in the pytest child refuses to run unless the core it imports is the sanitized
copy and libasan is mapped in that process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# The tests that drive the compiled core.
CORE_TESTS = (
    "tests/test_envelope.py",
    "tests/spool/test_ring_model.py",
    "tests/spool/test_segments.py",
    "tests/spool/test_segments_model.py",
    "tests/spool/test_segments_recovery.py",
    "tests/spool/test_spare_files.py",
    "tests/spool/test_partitioner.py",
    "tests/spool/test_ring_concurrency.py",
    "tests/spool/test_recovery_fuzz.py",
    "tests/_core/test_intake.py",
    "tests/_core/test_handoff.py",
    "tests/_core/test_transfer.py",
    "tests/_core/test_record.py",
    "tests/_core/test_wire.py",
    "tests/_core/test_frames.py",
    "tests/_core/test_listener.py",
    "tests/_core/test_core_lock.py",
    "tests/client/test_sync_in_person.py",
    "tests/client/test_sync_answers.py",
    "tests/client/test_sync_lane.py",
    "tests/client/test_busy_poll.py",
)

# A line of any sanitizer report: ASan's "ERROR: AddressSanitizer: ..." and SUMMARY lines,
# UBSan's "file.c:12:3: runtime error: ...".
SANITIZER_LINE = re.compile(r"AddressSanitizer|UndefinedBehaviorSanitizer|runtime error:")

# Leak detection is off: CPython itself does not free everything at exit. ASan's reports go
# to files (log_path, one per process, children of the tests included): a report written
# to stderr could be lost in pytest's output capture. gcc's UBSan, sharing the process
# with ASan, writes to stderr whatever its log_path, so the child pytest runs with
# --capture=sys, which leaves fd 2 to this test.
ASAN_OPTIONS = "detect_leaks=0:abort_on_error=1:halt_on_error=1"
UBSAN_OPTIONS = "halt_on_error=1:print_stacktrace=1"

PROBE_MODULE = "_eventspool_sanitizer_probe"
HYPOTHESIS_PROFILE = "eventspool-sanitized"

# A pytest plugin for the child run, imported with -p: it registers a Hypothesis profile
# without deadlines (sanitized code is several times slower, and a missed deadline is
# no finding), with half the examples (each still drives every path the unsanitized run
# drives with the full count; the suite's time is bounded) and without the example
# database, and it stops the run before any test
# unless the core is the sanitized build and libasan is in this process.
PROBE_SOURCE = textwrap.dedent(
    f'''
    """Checks, in the sanitized child, that the sanitized core is the one under test."""

    import os
    import sys

    import pytest
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        {HYPOTHESIS_PROFILE!r},
        deadline=None,
        database=None,
        max_examples=50,
        suppress_health_check=[HealthCheck.too_slow],
    )


    def pytest_configure(config):
        from eventspool._core import native

        expected = os.environ["EVENTSPOOL_SANITIZED_CORE"]
        if os.path.realpath(native.__file__) != os.path.realpath(expected):
            raise pytest.UsageError(
                f"imported {{native.__file__}}, not the sanitized build {{expected}}"
            )
        with open("/proc/self/maps") as maps:
            if not any("libasan" in line for line in maps):
                raise pytest.UsageError("libasan is not loaded in the test process")
        sys.stderr.write(f"sanitizer probe: native={{native.__file__}} libasan=loaded\\n")
    '''
)

# Overruns a 32-byte malloc'd block by 16 bytes through the intercepted memmove: the
# sanitizer runtime must stop it. The prints are flushed because the abort loses buffers.
CANARY_SOURCE = textwrap.dedent(
    """
    import ctypes

    from eventspool._core import native

    print("native", native.__file__, flush=True)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    block = libc.malloc(32)
    ctypes.memmove(block, b"x" * 48, 48)
    print("overrun not caught", flush=True)
    """
)


def _gcc_runtime(gcc: str, name: str) -> str | None:
    """The path of a gcc runtime library, or None where gcc has none by that name."""
    found = subprocess.run(
        [gcc, f"-print-file-name={name}"], capture_output=True, text=True, check=False
    ).stdout.strip()
    # gcc echoes the bare name back when it has no such file.
    return found if os.path.isabs(found) and os.path.exists(found) else None


STACK_FRAME = re.compile(r"^\s*#(\d+) ")


def _trim_stacks(report: str, frames: int = 15) -> str:
    """`report` with each stack cut to its innermost frames: the interpreter's are noise."""
    kept: list[str] = []
    for line in report.splitlines():
        frame = STACK_FRAME.match(line)
        if frame is None or int(frame.group(1)) < frames:
            kept.append(line)
        elif int(frame.group(1)) == frames:
            kept.append("    ...")
    return "\n".join(kept)


def _sanitizer_report(output: str, limit: int = 150) -> str:
    """The sanitizer report in `output`, from its first line on; else the output's tail."""
    lines = _trim_stacks(output).splitlines()
    for index, line in enumerate(lines):
        if SANITIZER_LINE.search(line):
            start = index - 1 if index and lines[index - 1].startswith("====") else index
            return "\n".join(lines[start : start + limit])
    return "\n".join(lines[-limit:])


def _sanitizer_options(base_env: dict[str, str], reports: Path) -> dict[str, str]:
    """`base_env` with the sanitizers' options, ASan writing its reports under `reports`."""
    reports.mkdir()
    return {
        **base_env,
        "ASAN_OPTIONS": f"{ASAN_OPTIONS}:log_path={reports / 'asan'}",
        "UBSAN_OPTIONS": UBSAN_OPTIONS,
    }


def _read_reports(reports: Path) -> str:
    """Every sanitizer report written under `reports`, each headed by its file's name."""
    return "\n".join(
        f"--- {path.name}\n{_trim_stacks(path.read_text(errors='replace'))}"
        for path in sorted(reports.iterdir())
    )


def _run(
    command: list[str], *, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        partial = b"".join(
            part if isinstance(part, bytes) else part.encode()
            for part in (exc.stdout, exc.stderr)
            if part
        )
        pytest.fail(
            f"{command} did not finish in {timeout:.0f}s; its output so far:\n"
            + _sanitizer_report(partial.decode(errors="replace"))
        )


def _copy_project(destination: Path) -> Path:
    """Copy what setup.py needs to build the core; return the copied src directory."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        if (REPO_ROOT / name).exists():
            shutil.copy2(REPO_ROOT / name, destination / name)
    src = destination / "src"
    # Without the normal build's module and generated C, so both are made afresh here.
    shutil.copytree(
        REPO_ROOT / "src" / "eventspool",
        src / "eventspool",
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"),
    )
    return src


# The test's own limit; its steps share what is left of STEPS_BUDGET_S below it, so a stuck
# step fails with its output rather than a bare timeout.
TEST_TIMEOUT_S = 600
STEPS_BUDGET_S = TEST_TIMEOUT_S - 20


@pytest.mark.slow
# About a minute on an idle machine: the build (half of it), then the tests. In a full
# suite on two cores the tests took over five minutes: the test run gets what the build
# and the canary left of the budget.
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_core_under_sanitizers(tmp_path: Path) -> None:
    deadline = time.monotonic() + STEPS_BUDGET_S
    if not sys.platform.startswith("linux"):
        pytest.skip("the sanitized run reads /proc/self/maps and preloads ELF runtimes")
    gcc, nm = shutil.which("gcc"), shutil.which("nm")
    if gcc is None or nm is None:
        pytest.skip("the sanitized build needs gcc and binutils (nm)")
    libasan = _gcc_runtime(gcc, "libasan.so")
    if libasan is None:
        pytest.skip("gcc has no AddressSanitizer runtime (libasan) here")
    libubsan = _gcc_runtime(gcc, "libubsan.so")
    sanitizers = "address,undefined" if libubsan else "address"

    # The build: the project's setup.py on the copied sources, sanitizer flags added.
    # -O0 (setup.py leaves out its -O2 when CFLAGS names a level): the sanitizers find
    # the same errors at any level, and compiling the generated C is most of this test's
    # time (-O1 cost half a minute more here); -g1, line tables for the reports' stacks.
    src = _copy_project(tmp_path)
    build_env = {key: value for key, value in os.environ.items() if key != "LDSHARED"}
    build_env.update(
        CC=gcc,
        CFLAGS=f"-fsanitize={sanitizers} -fno-omit-frame-pointer -g1 -O0",
        LDFLAGS=f"-fsanitize={sanitizers}",
    )
    build = _run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=tmp_path,
        env=build_env,
        timeout=240,
    )
    assert build.returncode == 0, f"sanitized build failed:\n{build.stdout}\n{build.stderr}"
    built = sorted((src / "eventspool" / "_core").glob("native.*.so"))
    assert len(built) == 1, f"expected one built core module, found {built}"
    core = built[0]

    # The module is instrumented: it calls into the sanitizer runtimes.
    imports = _run([nm, "-D", "--undefined-only", str(core)], cwd=tmp_path, env={}, timeout=60)
    assert "__asan_report_load" in imports.stdout, f"{core} is not built with ASan"
    if libubsan:
        assert "__ubsan_handle_" in imports.stdout, f"{core} is not built with UBSan"

    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    (probe_dir / f"{PROBE_MODULE}.py").write_text(PROBE_SOURCE)

    env = {
        key: value
        for key, value in os.environ.items()
        if key != "PYTEST_ADDOPTS" and not key.startswith("PYTEST_XDIST_")
    }
    env.update(
        PYTHONPATH=os.pathsep.join(
            part for part in (str(src), str(probe_dir), os.environ.get("PYTHONPATH")) if part
        ),
        # libasan must be the first library of the process.
        LD_PRELOAD=" ".join(
            part for part in (libasan, libubsan, os.environ.get("LD_PRELOAD")) if part
        ),
        # Every Python object from malloc, so ASan sees overruns of Python's buffers too.
        PYTHONMALLOC="malloc",
        EVENTSPOOL_SANITIZED_CORE=str(core),
    )

    # The runtime is live in that environment and its report reaches us: an overrun dies.
    canary_reports = tmp_path / "canary-reports"
    canary = _run(
        [sys.executable, "-c", CANARY_SOURCE],
        cwd=REPO_ROOT,
        env=_sanitizer_options(env, canary_reports),
        timeout=60,
    )
    assert f"native {core}" in canary.stdout, (
        f"the canary did not import the sanitized core:\n{canary.stdout}\n{canary.stderr}"
    )
    assert canary.returncode != 0, f"a heap overrun went unnoticed:\n{canary.stdout}"
    assert "AddressSanitizer: heap-buffer-overflow" in _read_reports(canary_reports), (
        f"a heap overrun gave no ASan report:\n{canary.stderr}"
    )

    run_reports = tmp_path / "reports"
    tests = list(CORE_TESTS)
    run = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            PROBE_MODULE,
            "-q",
            "-x",
            # Python-level capture only: anything written to fd 2 reaches this test.
            "--capture=sys",
            # A hung test is reported with its stacks before the run's own limit.
            "--timeout=180",
            "-n",
            "0",
            "--hypothesis-seed=0",
            f"--hypothesis-profile={HYPOTHESIS_PROFILE}",
            *tests,
        ],
        cwd=REPO_ROOT,
        env=_sanitizer_options(env, run_reports),
        timeout=deadline - time.monotonic(),
    )
    output = f"{run.stdout}\n{run.stderr}"
    reports = _read_reports(run_reports)
    assert not reports, (
        f"the sanitizers reported an error in the compiled core (exit {run.returncode}):\n"
        + reports
        + "\n--- the test run's output:\n"
        + "\n".join(output.splitlines()[-40:])
    )
    assert not any(SANITIZER_LINE.search(line) for line in output.splitlines()), (
        f"the sanitizers reported an error in the compiled core (exit {run.returncode}):\n"
        + _sanitizer_report(output)
    )
    assert f"sanitizer probe: native={core}" in run.stderr, (
        f"the tests did not run against the sanitized core:\n{_sanitizer_report(output)}"
    )
    assert run.returncode == 0, (
        f"the sanitized test run failed (exit {run.returncode}) without a sanitizer report:\n"
        + _sanitizer_report(output)
    )
