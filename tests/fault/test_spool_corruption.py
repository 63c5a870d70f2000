"""Damaged queue files, and a disk that is full when a new queue file is needed.

The files are damaged by hand, following the format documented in `ring.py`, so each
test knows exactly which records are gone: a damaged tail must cost exactly those
records, a damaged header must stop the open without touching the file, and a full
disk must fail `send()` cleanly instead of leaving half a file or dying of SIGBUS.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventspool._core.native import crc32c
from eventspool.config import QueueSettings, SpoolSettings
from eventspool.envelope import decode
from eventspool.errors import CorruptQueueError, DiskFullError, QueueFileError
from eventspool.pipeline import Spool
from eventspool.spool.ring import HEADER_SIZE, RingQueue, frame_size
from eventspool.spool.segments import SegmentedQueue
from tests.conftest import SmallDiskFactory

pytestmark = pytest.mark.fault

REPO_ROOT = Path(__file__).resolve().parents[2]
SETTINGS = QueueSettings(capacity_bytes=64 * 1024)
SPOOL_SETTINGS = SpoolSettings(max_event_bytes=4096, queue=SETTINGS)
RECORDS = 40

_FRAME = struct.Struct("<IIQQII")
_STATIC = struct.Struct("<8sIIQ")
_SLOT = struct.Struct("<QQQQQQ")
_SLOT_OFFSETS = (64, 128)
_PADDING_FLAG = 0x8000_0000


@dataclass(frozen=True)
class Frame:
    """One record frame as it sits in the file (offset is from the start of the file)."""

    offset: int
    length: int
    seq: int
    generation: int

    @property
    def end(self) -> int:
        return self.offset + frame_size(self.length)


def frames(path: Path) -> list[Frame]:
    """Walk the frames of a ring that never wrapped, by the documented layout.

    Stops at a zero length word, or at one that cannot be a record here (garbage).
    """
    data = path.read_bytes()
    capacity = _STATIC.unpack_from(data, 0)[3]
    found: list[Frame] = []
    pos = 0
    while pos + _FRAME.size <= capacity:
        word, _, seq, _, generation, _ = _FRAME.unpack_from(data, HEADER_SIZE + pos)
        if word == 0 or word & _PADDING_FLAG or frame_size(word) > capacity - pos:
            break
        found.append(Frame(HEADER_SIZE + pos, word, seq, generation))
        pos += frame_size(word)
    return found


def payloads(count: int, start: int = 0) -> list[bytes]:
    """Records of varied length whose bytes say which record they are."""
    return [
        (b"record-%05d|" % i) * (1 + (i * 37) % 23) + bytes([i % 251]) * (i % 7)
        for i in range(start, start + count)
    ]


def write_ring(path: Path, records: list[bytes]) -> None:
    with RingQueue.open(path, SETTINGS) as ring:
        for record in records:
            ring.append(record)


def read_all(ring: RingQueue | SegmentedQueue) -> list[bytes]:
    ring.rewind()
    out: list[bytes] = []
    while batch := ring.read_batch(max_records=10_000, max_bytes=1 << 30):
        out.extend(record.payload for record in batch)
    return out


def damage(path: Path, victims: list[Frame], kind: str) -> None:
    """Damage the given frames the way a crash, a bad disk or a stray write would."""
    with path.open("r+b") as handle:
        if kind in ("garbage", "zeros"):
            start, end = victims[0].offset, victims[-1].end
            handle.seek(start)
            handle.write(os.urandom(end - start) if kind == "garbage" else bytes(end - start))
            return
        for frame in victims:
            if kind == "torn_length":  # body written, length word never: the commit point
                handle.seek(frame.offset)
                handle.write(bytes(4))
            elif kind == "torn_payload":  # length word present, end of the payload lost
                handle.seek(frame.offset + 32 + frame.length - 1)
                (last,) = handle.read(1)
                handle.seek(frame.offset + 32 + frame.length - 1)
                handle.write(bytes([last ^ 0x5A]))
            else:
                raise AssertionError(kind)


# ---- (a) damaged tail ------------------------------------------------------------------


@pytest.mark.parametrize("damaged", [1, 3])
@pytest.mark.parametrize("kind", ["garbage", "zeros", "torn_length", "torn_payload"])
def test_damaged_tail_keeps_exactly_the_valid_prefix(
    tmp_path: Path, kind: str, damaged: int
) -> None:
    """The records before the damage survive, the damaged ones are counted, nothing raises."""
    path = tmp_path / "ring.queue"
    original = payloads(RECORDS)
    write_ring(path, original)
    layout = frames(path)
    assert [f.seq for f in layout] == list(range(RECORDS))
    assert {f.generation for f in layout} == {1}
    kept = RECORDS - damaged
    damage(path, layout[kept:], kind)

    with RingQueue.open(path, SETTINGS) as ring:
        report = ring.recovery
        assert report.records == kept
        assert report.skipped_records == damaged
        assert report.corrupt_tail
        assert report.bytes == layout[kept].offset - HEADER_SIZE
        assert str(kept) in report.stop_reason
        assert ring.depth == kept
        assert read_all(ring) == original[:kept]
        stats = ring.stats()
        assert stats.skipped_total == damaged
        assert stats.generation == 2
        # Rewrite the damaged slots with records of the same sizes, so that the old
        # frames after them sit exactly where the scan will look next.
        fresh = [b"F" * f.length for f in layout[kept : kept + min(damaged, 2)]]
        for expected_seq, record in enumerate(fresh, start=kept):
            assert ring.append(record) == expected_seq

    with RingQueue.open(path, SETTINGS) as ring:
        report = ring.recovery
        assert report.records == kept + len(fresh)
        assert report.skipped_records == 0
        assert read_all(ring) == original[:kept] + fresh  # no old record comes back
        assert ring.stats().skipped_total == damaged
        assert ring.stats().generation == 3
        if kind in ("zeros", "torn_length") or len(fresh) == damaged:
            # Nothing readable is left after the fresh records. (Leftover garbage and a
            # stale intact header are the subjects of the tests below.)
            assert not report.corrupt_tail, report
    new_layout = frames(path)
    assert [f.generation for f in new_layout[: kept + len(fresh)]] == [1] * kept + [2] * len(fresh)


def test_garbage_after_a_recovered_tail_is_not_reported_again(tmp_path: Path) -> None:
    """Once a recovery has dealt with a garbage tail, later reopens should be clean."""
    path = tmp_path / "ring.queue"
    write_ring(path, payloads(RECORDS))
    layout = frames(path)
    damage(path, layout[RECORDS - 5 :], "garbage")
    with RingQueue.open(path, SETTINGS) as ring:
        assert ring.recovery.skipped_records == 5
        ring.append(b"after the recovery")
    with RingQueue.open(path, SETTINGS) as ring:
        assert ring.recovery.skipped_records == 0
        assert not ring.recovery.corrupt_tail, ring.recovery


def test_rewrite_after_recovery_does_not_resurrect_skipped_records(tmp_path: Path) -> None:
    """Intact records behind a torn one were declared skipped; a rewrite must not revive them.

    The fresh record has the torn one's size, so the next old record sits exactly where
    the scan looks next, with the very sequence it expects and a valid CRC: only the
    generation field (older than the fresh record's) tells it apart.
    """
    path = tmp_path / "ring.queue"
    original = payloads(RECORDS)
    write_ring(path, original)
    layout = frames(path)
    kept = RECORDS - 3
    damage(path, layout[kept : kept + 1], "torn_payload")
    with RingQueue.open(path, SETTINGS) as ring:
        assert ring.recovery.records == kept
        assert ring.recovery.skipped_records == 3
        fresh = b"F" * layout[kept].length
        assert ring.append(fresh) == kept
    # The recovery zeroed what it skipped, so no stale record can follow the fresh one.
    assert len(frames(path)) == kept + 1
    assert frames(path)[kept].generation == 2
    with RingQueue.open(path, SETTINGS) as ring:
        assert read_all(ring) == [*original[:kept], fresh]
        assert ring.recovery.records == kept + 1
        assert not ring.recovery.corrupt_tail


def test_acknowledged_rewrite_does_not_resurrect_skipped_records(tmp_path: Path) -> None:
    """Records a recovery skipped must stay gone, even after the head moves past the damage."""
    path = tmp_path / "ring.queue"
    original = [b"%03d" % i * 10 for i in range(10)]
    write_ring(path, original)
    layout = frames(path)
    damage(path, layout[5:6], "torn_payload")  # records 6..9 stay intact behind it
    with RingQueue.open(path, SETTINGS) as ring:
        assert ring.recovery.skipped_records == 5
        ring.append(b"new" * 10)  # same size: record 6 of the old lap follows it exactly
        batch = ring.read_batch()
        ring.ack(batch[-1].seq)
        assert ring.depth == 0
    with RingQueue.open(path, SETTINGS) as ring:
        assert read_all(ring) == []


@settings(
    max_examples=60,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_any_damage_in_the_record_area_keeps_the_undamaged_prefix(
    tmp_path: Path, data: st.DataObject
) -> None:
    """Wherever bytes flip, reopening keeps the records before the first one touched."""
    base = tmp_path / "base.queue"
    if not base.exists():
        write_ring(base, payloads(RECORDS))
    layout = frames(base)
    pristine = base.read_bytes()
    start = data.draw(st.integers(HEADER_SIZE, layout[-1].end + 256), label="start")
    length = data.draw(st.integers(1, 600), label="length")
    mask = data.draw(st.binary(min_size=length, max_size=length), label="mask")
    damaged = bytearray(pristine)
    for i, byte in enumerate(mask):
        damaged[start + i] ^= byte | 1  # never zero: every byte in range really changes
    path = tmp_path / "damaged.queue"
    path.write_bytes(bytes(damaged))
    # A record is lost when a byte its CRC or header covers changed; the alignment
    # padding after a payload is covered by nothing.
    kept = next(
        (
            i
            for i, f in enumerate(layout)
            if start < f.offset + 32 + f.length and f.offset < start + length
        ),
        RECORDS,
    )
    with RingQueue.open(path, SETTINGS) as ring:
        assert ring.recovery.records == kept
        assert ring.recovery.skipped_records == RECORDS - kept
        assert ring.recovery.corrupt_tail or kept == RECORDS
        assert read_all(ring) == payloads(kept)


def _spool_events(spool: Spool, topic: str) -> list[str]:
    (ref,) = [ref for ref in spool.queues() if ref.topic == topic]
    return [decode(payload).event_id for payload in read_all(ref.ring)]


@pytest.mark.parametrize("kind", ["garbage", "zeros", "torn_payload"])
def test_spool_reports_and_survives_a_damaged_tail(tmp_path: Path, kind: str) -> None:
    """The Spool names the damaged ring in recovery_reports() and keeps the valid events."""
    damaged = 4
    with Spool(tmp_path, settings=SPOOL_SETTINGS) as spool:
        for topic in ("hurt", "fine"):
            spool.set_partition_count(topic, 1)
        ids = {
            topic: [spool.send(topic, b"value-%04d" % i, b"key") for i in range(RECORDS)]
            for topic in ("hurt", "fine")
        }
    hurt_path = tmp_path / "topics" / "hurt" / "0.queue"
    damage(hurt_path, frames(hurt_path)[RECORDS - damaged :], kind)

    with Spool(tmp_path, settings=SPOOL_SETTINGS) as spool:
        reports = spool.recovery_reports()
        assert list(reports) == [str(hurt_path)]
        assert reports[str(hurt_path)].skipped_records == damaged
        assert reports[str(hurt_path)].records == RECORDS - damaged
        assert _spool_events(spool, "hurt") == ids["hurt"][: RECORDS - damaged]
        assert _spool_events(spool, "fine") == ids["fine"]
        # Same-size events land exactly on the damaged frames.
        later = [spool.send("hurt", b"later-%04d" % i, b"key") for i in range(damaged)]

    with Spool(tmp_path, settings=SPOOL_SETTINGS) as spool:
        assert spool.recovery_reports() == {}
        assert _spool_events(spool, "hurt") == ids["hurt"][: RECORDS - damaged] + later
        assert _spool_events(spool, "fine") == ids["fine"]


# ---- (b) damaged header ----------------------------------------------------------------


def _fix_static_crc(data: bytearray) -> None:
    data[24:28] = struct.pack("<I", crc32c(bytes(data[0:24])))


def _bad_magic(data: bytearray) -> None:
    data[0:8] = b"NOTARING"


def _capacity(data: bytearray) -> None:
    data[16:24] = struct.pack("<Q", 128 * 1024)


def _capacity_with_crc(data: bytearray) -> None:
    data[16:24] = struct.pack("<Q", 128 * 1024)
    _fix_static_crc(data)


def _version_with_crc(data: bytearray) -> None:
    data[8:12] = struct.pack("<I", 99)
    _fix_static_crc(data)


def _header_crc(data: bytearray) -> None:
    data[24] ^= 0xFF


def _both_slots(data: bytearray) -> None:
    for offset in _SLOT_OFFSETS:
        data[offset + 8] ^= 0x01


def _truncated(data: bytearray) -> None:
    del data[HEADER_SIZE + 4096 :]


HEADER_DAMAGE = {
    "magic": (_bad_magic, "bad magic"),
    "capacity": (_capacity, "checksum"),
    "capacity_crc_fixed": (_capacity_with_crc, "capacity"),
    "version_crc_fixed": (_version_with_crc, "version 99"),
    "header_crc": (_header_crc, "checksum"),
    "both_slots": (_both_slots, "both copies"),
    "truncated": (_truncated, "capacity"),
}


@pytest.mark.parametrize("name", sorted(HEADER_DAMAGE))
def test_damaged_header_refuses_to_open_and_leaves_the_file_alone(
    tmp_path: Path, name: str
) -> None:
    """Guessing positions could hand out garbage or lose data: raise, name the file, keep it."""
    mutate, fragment = HEADER_DAMAGE[name]
    path = tmp_path / "ring.queue"
    write_ring(path, payloads(10))
    data = bytearray(path.read_bytes())
    mutate(data)
    path.write_bytes(bytes(data))
    before = path.read_bytes()
    for writable in (True, False):
        with pytest.raises(CorruptQueueError) as caught:
            RingQueue.open(path, SETTINGS, writable=writable)
        assert str(path) in str(caught.value)
        assert caught.value.path == str(path)
        assert fragment in caught.value.reason
        assert path.read_bytes() == before


def _spool_with_a_bad_queue(tmp_path: Path) -> tuple[Path, bytes]:
    """Two topics, one queue each; the queue of "b-bad" gets a bad magic number."""
    with Spool(tmp_path, settings=SPOOL_SETTINGS) as spool:
        for topic in ("a-good", "b-bad"):
            spool.set_partition_count(topic, 1)
            spool.send(topic, b"value")
    bad = tmp_path / "topics" / "b-bad" / "0.queue"
    data = bytearray(bad.read_bytes())
    _bad_magic(data)
    bad.write_bytes(bytes(data))
    return bad, bytes(data)


def test_spool_refuses_a_damaged_header_and_can_be_retried(tmp_path: Path) -> None:
    """The Spool raises naming the file, leaves it as it was, and does not keep the lock."""
    bad, data = _spool_with_a_bad_queue(tmp_path)
    for _ in range(2):  # the second attempt must meet the same error, not a stale lock
        with pytest.raises(CorruptQueueError, match="bad magic") as caught:
            Spool(tmp_path, settings=SPOOL_SETTINGS)
        assert caught.value.path == str(bad)
        assert bad.read_bytes() == data


def _descriptors_on(path: Path) -> int:
    """How many of this process's file descriptors refer to `path`, after a full collection.

    Collecting first means an object merely awaiting the garbage collector does not count.
    """
    gc.collect()
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
    return count


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_failed_spool_open_does_not_leak_descriptors(tmp_path: Path) -> None:
    """A service retrying a failed open must not run out of file descriptors."""
    _spool_with_a_bad_queue(tmp_path)
    good = tmp_path / "topics" / "a-good" / "0.queue"
    assert _descriptors_on(good) == 0
    for _ in range(3):
        with pytest.raises(CorruptQueueError):
            Spool(tmp_path, settings=SPOOL_SETTINGS)
    assert _descriptors_on(good) == 0


def _slots(path: Path) -> list[tuple[int, int, int]]:
    """(offset, counter, head_seq) of each slot whose CRC holds."""
    data = path.read_bytes()
    valid = []
    for offset in _SLOT_OFFSETS:
        fields = _SLOT.unpack_from(data, offset)
        (stored,) = struct.unpack_from("<I", data, offset + _SLOT.size)
        if stored == crc32c(data[offset : offset + _SLOT.size]):
            valid.append((offset, fields[0], fields[2]))
    return valid


def _acks_then_dies(path: Path) -> None:
    """In a forked child: acknowledge twice and vanish without closing, like a crash."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ring = RingQueue.open(path, SETTINGS)
            for record in payloads(10):
                ring.append(record)
            ring.ack(ring.read_batch(max_records=3)[-1].seq)
            ring.ack(ring.read_batch(max_records=3)[-1].seq)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("which", ["newer", "older"])
def test_one_damaged_position_slot_falls_back_to_the_other(tmp_path: Path, which: str) -> None:
    """Two slots exist so that a torn slot write costs at most a re-delivery, never the queue."""
    path = tmp_path / "ring.queue"
    _acks_then_dies(path)
    slots = sorted(_slots(path), key=lambda slot: slot[1])
    assert [head for _, _, head in slots] == [3, 6]
    victim, survivor = (slots[1], slots[0]) if which == "newer" else (slots[0], slots[1])
    with path.open("r+b") as handle:
        handle.seek(victim[0] + 16)
        handle.write(b"\xff" * 8)  # the head sequence, now covered by a wrong CRC
    assert len(_slots(path)) == 1

    with RingQueue.open(path, SETTINGS) as ring:
        assert ring.stats().head_seq == survivor[2]
        assert read_all(ring) == payloads(10)[survivor[2] :]
    assert len(_slots(path)) == 2  # the open rewrote the damaged slot
    with RingQueue.open(path, SETTINGS) as ring:
        assert ring.stats().head_seq == survivor[2]


# ---- (c) disk full ---------------------------------------------------------------------


def _queue_files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*.queue*"))


def test_new_topic_on_a_full_disk_fails_cleanly(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes posix_fallocate fail in a child: a clear error, no debris, no SIGBUS."""
    directory = tmp_path / "spool"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fault.spool_writer", "disk-full", str(directory), "16384"],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"child ended with {proc.returncode}: {proc.stderr.decode()}"
    result = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    new_queue = directory / "topics" / "new" / "pending.queue"
    assert result["error"] == "QueueFileError"
    assert result["error_path"] == str(new_queue)
    assert str(new_queue) in result["message"]
    assert "cannot reserve" in result["message"]
    assert "File too large" in result["message"]
    assert result["files_while_full"] == ["topics/old/0.queue"]
    assert result["old_values_while_full"] == [f"old-{i}" for i in range(5)]

    with Spool(directory, settings=SpoolSettings(max_event_bytes=4096, queue=SETTINGS)) as spool:
        assert spool.recovery_reports() == {}
        assert _spool_events(spool, "old") == result["old_ids"]
        assert _spool_events(spool, "new") == [result["new_id"]]
    assert not list(directory.rglob("*.tmp"))


@pytest.fixture
def small_tmpfs(tmp_path: Path, small_disk: SmallDiskFactory) -> Path:
    """A real 2 MiB tmpfs, where posix_fallocate fails with ENOSPC."""
    return small_disk(tmp_path / "tmpfs", 2 * 1024 * 1024).path


def test_new_topic_on_a_full_tmpfs_fails_cleanly(small_tmpfs: Path) -> None:
    """ENOSPC from a real filesystem: clear error, no partial file, then works once space exists."""
    settings = SpoolSettings(max_event_bytes=4096, queue=QueueSettings(capacity_bytes=1024 * 1024))
    with Spool(small_tmpfs, settings=settings) as spool:
        spool.set_partition_count("first", 1)
        spool.set_partition_count("second", 1)
        first_ids = [spool.send("first", b"payload-%d" % i) for i in range(20)]
        with pytest.raises(QueueFileError, match="no space left on device") as caught:
            spool.send("second", b"does not fit")
        assert caught.value.path == str(small_tmpfs / "topics" / "second" / "0.queue")
        assert _queue_files(small_tmpfs) == ["topics/first/0.queue"]
        assert _spool_events(spool, "first") == first_ids

        subprocess.run(["mount", "-o", "remount,size=4m", str(small_tmpfs)], check=True, timeout=30)
        second_id = spool.send("second", b"fits now")
    with Spool(small_tmpfs, settings=settings) as spool:
        assert _spool_events(spool, "first") == first_ids
        assert _spool_events(spool, "second") == [second_id]
        assert spool.recovery_reports() == {}


def test_an_existing_queue_keeps_taking_events_on_a_full_tmpfs(small_tmpfs: Path) -> None:
    """Ring files are preallocated: with not one free block left on the file system, sends
    to a queue that already exists succeed, and reopening finds every one of them."""
    settings = SpoolSettings(max_event_bytes=4096, queue=QueueSettings(capacity_bytes=1024 * 1024))
    with Spool(small_tmpfs, settings=settings) as spool:
        spool.set_partition_count("first", 1)
        ids = [spool.send("first", b"before the disk filled up")]
        fd = os.open(small_tmpfs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with pytest.raises(OSError, match="No space left"):
                while True:
                    os.write(fd, bytes(65536))
        finally:
            os.close(fd)
        assert os.statvfs(small_tmpfs).f_bavail == 0
        ids += [spool.send("first", b"%04d" % i + b"." * 96) for i in range(2000)]
    with Spool(small_tmpfs, settings=settings) as spool:
        assert spool.recovery_reports() == {}
        assert _spool_events(spool, "first") == ids


def test_a_segment_that_does_not_fit_on_a_full_tmpfs_fails_cleanly(small_tmpfs: Path) -> None:
    """A backlog needs a new segment on a full disk: a clean DiskFullError for the event
    that needed it, no SIGBUS, nothing queued lost, no partial file; the queue grows
    once there is space again and takes events meanwhile wherever its segment has room."""
    queue = QueueSettings(capacity_bytes=8 * 256 * 1024, segment_bytes=256 * 1024)
    settings = SpoolSettings(max_event_bytes=4096, queue=queue)
    with Spool(small_tmpfs, settings=settings) as spool:
        spool.set_partition_count("burst", 1)
        ids = [spool.send("burst", b"%06d" % 0 + b"." * 994)]
        fd = os.open(small_tmpfs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with pytest.raises(OSError, match="No space left"):
                while True:
                    os.write(fd, bytes(65536))
        finally:
            os.close(fd)
        with pytest.raises(DiskFullError, match="no space left on device") as caught:
            while True:
                ids.append(spool.send("burst", b"%06d" % len(ids) + b"." * 994))
        assert caught.value.path == str(small_tmpfs / "topics" / "burst" / "0.1.queue")
        assert len(ids) > 200
        assert _queue_files(small_tmpfs) == ["topics/burst/0.queue"]
        assert _spool_events(spool, "burst") == ids
        (small_tmpfs / "filler").unlink()
        ids += [spool.send("burst", b"%06d" % len(ids) + b"." * 994) for _ in range(300)]
        assert _queue_files(small_tmpfs) == [
            f"topics/burst/{name}.queue" for name in ("0.1", "0.2", "0")
        ]
    with Spool(small_tmpfs, settings=settings) as spool:
        assert spool.recovery_reports() == {}
        assert _spool_events(spool, "burst") == ids
