"""Every ```python block of README.md and docs/*.md runs as written: pasted into a file
and run in a fresh interpreter, in an empty folder, against the embedded broker, a real
agent process and real directories. A newcomer pastes them; so does this test.

The blocks are run unchanged but for a fixed set of placeholders (PLACEHOLDERS below),
which the README says stand for the reader's own brokers, directories and socket.

A block that cannot run by nature says so in the markdown, with an HTML comment on the
line before its fence:

- ``<!-- snippet: continues the block above -->``: a fragment; it runs after the previous
  ```python block of the same file, as one script.
- ``<!-- snippet: not run: REASON -->``: skipped with REASON (kept few: MAX_NOT_RUN).

A block that calls ``.run()`` (a consumer) runs until stopped: it gets RUN_SECONDS, then
SIGTERM, and must then end by itself with status 0, as ``Consumer.run()`` does.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventspool.broker import LocalBroker
from eventspool.testing.agent import AgentProcess
from tests.spark.conftest import SPARK_COMMAND_MARKS

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

BROKERS_PLACEHOLDERS = ("kafka1:9092,kafka2:9092", "kafka1:9092")  # longest first
SPOOL_PLACEHOLDER = "/var/spool/"  # "/var/spool/myapp" becomes FOLDER/myapp
SOCKET_PLACEHOLDER = "/run/eventspool/agent.sock"
PLACEHOLDERS = (*BROKERS_PLACEHOLDERS, SPOOL_PLACEHOLDER, SOCKET_PLACEHOLDER)

CONTINUES = "continues the block above"
NOT_RUN = "not run:"
MAX_NOT_RUN = 2

RUN_SECONDS = 4.0  # how long a block that runs until stopped is left running
STOP_SECONDS = 60.0  # how long it may take to stop after SIGTERM
BLOCK_SECONDS = 90.0  # how long any other block may take

RUNS_UNTIL_STOPPED = re.compile(r"\.run\(\)")
STARTS_SPARK = re.compile(r"\bbuild_session\(")

_MARK = re.compile(r"^<!--\s*snippet:\s*(.*?)\s*-->$")
_FENCE = re.compile(r"^```(\S*)")


@dataclass(frozen=True, slots=True)
class Snippet:
    """One ```python block: where it is, its code (with what it continues), its mark."""

    document: str
    line: int
    code: str
    not_run: str | None = None

    @property
    def id(self) -> str:
        return f"{self.document}:{self.line}"


@dataclass(frozen=True, slots=True)
class _Block:
    """A ```python block as written, with the mark on the line before it, if any."""

    document: str
    line: int
    code: str
    mark: str | None


def parse(markdown: str, document: str) -> list[Snippet]:
    """The ```python blocks of one document, fragments joined to what they continue."""
    snippets: list[Snippet] = []
    for block in _blocks(markdown, document):
        snippets.append(_snippet(block, snippets[-1] if snippets else None))
    return snippets


def _blocks(markdown: str, document: str) -> Iterator[_Block]:
    """Each ```python block with its mark; a mark that stands before no ```python block
    is an error here rather than a block silently run or skipped."""
    lines = markdown.splitlines()
    mark: str | None = None
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        where = f"{document}:{index + 1}"
        if found := _MARK.match(line):
            mark = found.group(1)
        elif fence := _FENCE.match(line):
            end = _closing_fence(lines, index, where)
            if fence.group(1) == "python":
                yield _Block(document, index + 1, "\n".join(lines[index + 1 : end]) + "\n", mark)
            elif mark is not None:
                raise ValueError(f"{where}: a snippet mark before a block that is not python")
            mark, index = None, end
        elif line and mark is not None:
            raise ValueError(f"{where}: a snippet mark that is not right before a block")
        index += 1


def _closing_fence(lines: list[str], start: int, where: str) -> int:
    """The index of the line that closes the fence opened at `start`."""
    for index in range(start + 1, len(lines)):
        if lines[index].strip() == "```":
            return index
    raise ValueError(f"{where}: a code block that is never closed")


def _snippet(block: _Block, previous: Snippet | None) -> Snippet:
    """The block as its mark says to run it: alone, after `previous`, or not at all."""
    where = f"{block.document}:{block.line}"
    if block.mark is None:
        return Snippet(block.document, block.line, block.code)
    if block.mark == CONTINUES:
        if previous is None:
            raise ValueError(f"{where}: continues a block, but none comes before it")
        return Snippet(block.document, block.line, previous.code + block.code)
    if block.mark.startswith(NOT_RUN):
        reason = block.mark.removeprefix(NOT_RUN).strip()
        if not reason:
            raise ValueError(f"{where}: a block not run must say why")
        return Snippet(block.document, block.line, block.code, not_run=reason)
    raise ValueError(f"{where}: unknown snippet mark {block.mark!r}")


def all_snippets() -> list[Snippet]:
    """Every ```python block of the README and docs/, in reading order."""
    return [
        snippet
        for path in DOCUMENTS
        for snippet in parse(path.read_text(), path.relative_to(REPO).as_posix())
    ]


def cases() -> list[object]:
    """One test case per block, named file:line; a block that starts Spark is slow."""
    return [
        pytest.param(s, id=s.id, marks=SPARK_COMMAND_MARKS if STARTS_SPARK.search(s.code) else [])
        for s in all_snippets()
    ]


def substitute(code: str, brokers: str, folder: Path, socket_path: Path | None) -> str:
    """The placeholders made real: the test broker, a folder of the test, its agent."""
    for placeholder in BROKERS_PLACEHOLDERS:
        code = code.replace(placeholder, brokers)
    code = code.replace(SPOOL_PLACEHOLDER, f"{folder}/")
    if socket_path is not None:
        code = code.replace(SOCKET_PLACEHOLDER, os.fspath(socket_path))
    return code


@dataclass(frozen=True, slots=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    terminated: bool  # it was still running when the test sent SIGTERM


def run_script(script: Path, until_stopped: bool) -> Outcome:
    """Run `script` in its own folder and session; a script that runs until stopped gets
    SIGTERM after RUN_SECONDS. Whatever it left behind in its session is killed."""
    process = subprocess.Popen(
        [sys.executable, script.name],
        cwd=script.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    terminated = False
    try:
        if until_stopped:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(RUN_SECONDS)
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                terminated = True
        stdout, stderr = process.communicate(
            timeout=STOP_SECONDS if until_stopped else BLOCK_SECONDS
        )
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return Outcome(process.returncode, stdout, stderr, terminated)


@pytest.fixture(scope="module")
def agent_socket(broker: LocalBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real agent process shipping to the test broker, for the blocks that use one."""
    agent = AgentProcess(tmp_path_factory.mktemp("agent"), broker.bootstrap_servers)
    agent.start_answering()
    try:
        yield agent.socket_path
    finally:
        agent.stop()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("snippet", cases())
def test_snippet_runs(
    snippet: Snippet, broker: LocalBroker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The block runs to its end with status 0 and no traceback; one that runs until
    stopped is still running after RUN_SECONDS and then ends that way after SIGTERM."""
    if snippet.not_run is not None:
        pytest.skip(f"marked not run: {snippet.not_run}")
    socket_path: Path | None = None
    if SOCKET_PLACEHOLDER in snippet.code:
        socket_path = request.getfixturevalue("agent_socket")
    script = tmp_path / "snippet.py"
    script.write_text(substitute(snippet.code, broker.bootstrap_servers, tmp_path, socket_path))
    until_stopped = bool(RUNS_UNTIL_STOPPED.search(snippet.code))
    outcome = run_script(script, until_stopped)
    said = f"{snippet.id} ended with {outcome.returncode}\n{outcome.stdout}\n{outcome.stderr}"
    assert outcome.terminated == until_stopped, f"it ended before it was stopped: {said}"
    assert outcome.returncode == 0, said
    assert "Traceback" not in outcome.stderr, said
    assert "RuntimeError" not in outcome.stderr, said


def test_few_blocks_are_not_run() -> None:
    """Each block marked not run is a block a reader cannot trust: keep them rare."""
    skipped = [s.id for s in all_snippets() if s.not_run is not None]
    assert len(skipped) <= MAX_NOT_RUN, f"too many blocks marked not run: {skipped}"
    assert len(all_snippets()) >= 10, "the ```python blocks are no longer found"


def test_the_readme_says_what_the_placeholders_stand_for() -> None:
    """The test swaps these for real parts, so a reader must be told to do the same."""
    readme = (REPO / "README.md").read_text()
    note = readme[: readme.index("```python")].strip().rsplit("\n\n", 1)[-1]
    for placeholder in ("kafka1:9092", "/var/spool/myapp", SOCKET_PLACEHOLDER):
        assert f"`{placeholder}`" in note, f"the README's note before its first block: {note}"


def test_marks_are_read_as_documented() -> None:
    """A fragment runs with the block before it; a block not run needs a reason; an
    unknown mark is refused instead of being ignored."""
    fragment = "<!-- snippet: continues the block above -->\n```python\nb = a\n```\n"
    _, second = parse(f"```python\na = 1\n```\n\n{fragment}", "x.md")
    assert (second.id, second.code) == ("x.md:6", "a = 1\nb = a\n")
    skipped = parse("<!-- snippet: not run: needs X -->\n```python\n```\n", "x.md")
    assert skipped[0].not_run == "needs X"
    for bad in ("not run:", "continue", "not run: X -->\nprose\n<!-- x"):
        with pytest.raises(ValueError, match=r"x\.md:\d"):
            parse(f"<!-- snippet: {bad} -->\n```python\n```\n", "x.md")
