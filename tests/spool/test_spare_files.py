"""Spare segment files: created and mapped in one compiled call, renamed into the chain."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eventspool._core.native import MAP_CREATE, MappedFile, rename_holding_gil
from eventspool.clock import SYSTEM_CLOCK
from eventspool.config import QueueSettings
from eventspool.errors import QueueFileError
from eventspool.spool.ring import HEADER_SIZE, RingQueue, allocated_bytes
from eventspool.spool.segment_files import create_spare_ring
from tests.spool.segment_support import SEGMENT

SETTINGS = QueueSettings(capacity_bytes=SEGMENT, segment_bytes=SEGMENT)
REPO_ROOT = Path(__file__).resolve().parents[2]


def create_spare(path: Path) -> tuple[RingQueue, int]:
    return create_spare_ring(path, SETTINGS, max_payload=3000, clock=SYSTEM_CLOCK, on_fsync=None)


def test_a_mapped_ring_is_an_empty_ring_that_reopens_as_written(tmp_path: Path) -> None:
    path = tmp_path / "0.spare.1"
    ring, allocated = create_spare(path)
    with ring:
        assert allocated == allocated_bytes(path) >= HEADER_SIZE + SEGMENT
        assert ring.depth == 0 and ring.recovery.records == 0 and not ring.recovery.corrupt_tail
        for i in range(3):
            ring.append(f"event-{i}".encode(), timestamp_ms=i)
    with RingQueue.open(path, SETTINGS, create=False) as reopened:
        assert [r.payload for r in reopened.read_batch()] == [b"event-0", b"event-1", b"event-2"]


def test_fault_in_makes_the_pages_writeback_cleaned_writable_again(tmp_path: Path) -> None:
    """Once written back, a page is read-only in the mapping until a write faults; once
    the thread of start_fault_in is done, writing every page faults no more, and nothing
    was changed."""
    path = tmp_path / "0.spare.1"
    ring, _ = create_spare(path)
    pages = (HEADER_SIZE + SEGMENT) // 4096
    with ring:
        ring.append(b"kept", timestamp_ms=1)
        view = memoryview(ring._mm)  # the mapping RingCore writes through
        try:
            written = bytes(view)
            # Made before counting: the loop allocates nothing, so the faults it counts
            # are the mapping's, not the heap's (under the sanitizers, malloc faults often).
            offsets = list(range(0, len(view), 4096))

            def faults_writing_each_page() -> int:
                before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
                for offset in offsets:
                    view[offset] = view[offset]
                return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

            os.sync()
            assert faults_writing_each_page() >= pages // 2
            os.sync()
            assert ring.core.start_fault_in()
            ring.core.wait_fault_in()
            assert faults_writing_each_page() <= 2
            assert bytes(view) == written
            assert ring.core.start_fault_in()
        finally:
            view.release()  # else closing the ring hides a failed assert behind a BufferError
    assert not ring.core.start_fault_in()  # closed (after waiting for the last one)
    with RingQueue.open(path, SETTINGS, create=False) as reopened:
        assert [r.payload for r in reopened.read_batch()] == [b"kept"]


def test_a_mapping_lends_its_bytes_and_unmaps_only_when_no_one_holds_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "file"
    header = b"H" * 100
    mapping = MappedFile()
    assert mapping.create(os.fsencode(path), header, 3 * 4096) == (0, 0)
    try:
        view = memoryview(mapping)
        assert view[:100] == header and view[100:] == bytes(3 * 4096 - 100)
        assert mapping.allocated == allocated_bytes(path) == os.path.getsize(path)
        with pytest.raises(BufferError):
            mapping.close()
        view.release()
        mapping.close()
        mapping.close()
        with pytest.raises(ValueError, match="closed"):
            memoryview(mapping)
        with pytest.raises(ValueError, match="created already"):
            mapping.create(os.fsencode(path), header, 4096)
    finally:
        os.close(mapping.fd)
    with pytest.raises(ValueError, match="cannot hold"):
        MappedFile().create(os.fsencode(tmp_path / "small"), header, 50)


def test_a_file_that_cannot_be_created_is_a_queue_file_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "missing-directory" / "0.spare.1"
    assert MappedFile().create(os.fsencode(path), b"", 4096) == (MAP_CREATE, errno.ENOENT)
    with pytest.raises(QueueFileError, match="cannot create: No such file") as raised:
        create_spare(path)
    assert raised.value.path == str(path)


def test_a_reservation_the_disk_refuses_is_an_error_and_leaves_no_file(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes posix_fallocate fail (EFBIG) in a child, as a full disk would
    (ENOSPC): a QueueFileError, no SIGBUS, and the partial file removed."""
    path = tmp_path / "0.spare.1"
    child = textwrap.dedent(
        f"""
        import resource, signal, sys
        from pathlib import Path
        from eventspool.errors import QueueFileError
        from tests.spool.test_spare_files import create_spare
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
        try:
            create_spare(Path({str(path)!r}))
        except QueueFileError as exc:
            print(exc)
            sys.exit(0)
        sys.exit("no error")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", child], cwd=REPO_ROOT, capture_output=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode()
    message = proc.stdout.decode()
    assert str(path) in message and "cannot reserve" in message and "File too large" in message
    assert not path.exists()


def test_a_rename_holding_the_interpreter_lock_reports_its_errno(tmp_path: Path) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    source.write_bytes(b"x")
    assert rename_holding_gil(os.fsencode(source), os.fsencode(target)) == 0
    assert target.read_bytes() == b"x" and not source.exists()
    assert rename_holding_gil(os.fsencode(source), os.fsencode(target)) == errno.ENOENT
