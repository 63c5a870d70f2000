# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, freethreading_compatible=False, autotestdict=False
"""The compiled core: the byte work of every hot path, one implementation.

The Python modules above it keep policy: configuration, errors and their wording,
retries, routing decisions and metrics. What is here frames records into the ring files
(ring.pxi) and creates and maps new ones (mapped_file.pxi), builds and parses envelopes
(envelope.pxi), makes event ids (ids.pxi), hashes keys and picks partitions (route.pxi),
and feeds drained batches to librdkafka and accounts their delivery reports
(delivery.pxi); it also writes the agent's SEND frames straight into the rings
(intake.pxi), serves the agent's unix socket on a thread of its own (listener.pxi), cuts
the wire's byte stream into frames (frames.pxi), encodes a client's events for those
frames (wire.pxi), keeps a blocking client's shared connection state and makes its
send() alone on it (in_person.pxi), packs the consumer's key-ordered records for its workers (transfer.pxi), hands them over in shared
memory (handoff.pxi) and builds the Records its handlers get (record.pxi). The formats
are written out at the top of eventspool/spool/ring.py and eventspool/envelope.py; the
golden-bytes tests check this code against them, not against itself.

Locking: a ring's lock is a pthread mutex. A thread holding the interpreter lock only
ever try-locks it, and waits for it with the interpreter lock released, so a ring
holder that copies a large event without the interpreter lock can never deadlock with
a thread that holds the interpreter lock and wants the ring.
"""

cimport posix.fcntl as fcntl
cimport libc.stdio as stdio
cimport posix.mman as mman
cimport posix.unistd as unistd
from cpython.buffer cimport (
    PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer,
)
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8String, PyUnicode_DecodeUTF8
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport EAGAIN, EINTR, errno
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcmp, memcpy, memset, strerror
from posix.stat cimport fstat, struct_stat
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec


cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *mutex, void *attr)
    int pthread_mutex_destroy(pthread_mutex_t *mutex)
    int pthread_mutex_lock(pthread_mutex_t *mutex)
    int pthread_mutex_trylock(pthread_mutex_t *mutex)
    int pthread_mutex_unlock(pthread_mutex_t *mutex)


cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void *PyUnicode_DATA(object text)
    # The UTF-8 the str keeps once made: no bytes object per call.
    const char *PyUnicode_AsUTF8AndSize(object text, Py_ssize_t *size) except NULL


cdef extern from "bytes_util.h":
    void es_crc_init() nogil
    int es_crc_hardware
    uint32_t es_crc32c(uint32_t crc, const void *data, size_t n) nogil
    uint32_t es_crc32c_portable(uint32_t crc, const void *data, size_t n) nogil
    uint32_t es_crc32_ieee(const void *data, size_t n) nogil
    int32_t es_murmur2(const void *data, size_t n) nogil
    void es_put_u16(char *p, uint16_t v) nogil
    void es_put_u32(char *p, uint32_t v) nogil
    void es_put_u64(char *p, uint64_t v) nogil
    uint16_t es_get_u16(const char *p) nogil
    uint32_t es_get_u32(const char *p) nogil
    uint64_t es_get_u64(const char *p) nogil
    void es_publish_u32(char *p, uint32_t v) nogil
    void es_store_release_u64(uint64_t *p, uint64_t v) nogil
    uint64_t es_load_acquire_u64(const uint64_t *p) nogil
    void es_put_be16(char *p, uint16_t v) nogil
    void es_put_be32(char *p, uint32_t v) nogil
    uint16_t es_get_be16(const char *p) nogil
    uint32_t es_get_be32(const char *p) nogil


es_crc_init()

# Copies and checksums from this size on run without the interpreter lock, so other
# threads go on while a large event is written; below it the hand-off costs more.
cdef enum:
    NOGIL_BYTES = 65536


cdef inline int64_t _wall_ms() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef inline const char *_bytes_or_null(object data, Py_ssize_t *length):
    if data is None:
        length[0] = -1
        return NULL
    length[0] = PyBytes_GET_SIZE(data)
    return PyBytes_AS_STRING(data)


def crc32c(data, unsigned int value=0) -> int:
    """CRC-32C of any bytes-like object, continuing from `value`."""
    cdef Py_buffer view
    cdef uint32_t crc
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len >= NOGIL_BYTES:
            with nogil:
                crc = es_crc32c(value, view.buf, view.len)
        else:
            crc = es_crc32c(value, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return crc


def crc32c_portable(data, unsigned int value=0) -> int:
    """The table-driven CRC-32C that runs where the CPU has no crc32 instruction."""
    cdef Py_buffer view
    cdef uint32_t crc
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        crc = es_crc32c_portable(value, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return crc


def crc32c_hardware() -> bool:
    """Whether CRC-32C runs on the CPU's own instruction here."""
    return es_crc_hardware != 0


def murmur2(const unsigned char[::1] data) -> int:
    """Kafka's `Utils.murmur2` as a signed 32-bit int; the sign matters to other clients."""
    if data.shape[0] == 0:
        return es_murmur2(b"", 0)
    return es_murmur2(&data[0], data.shape[0])


def partition_for_key(bytes key not None, int partition_count) -> int:
    """`toPositive(murmur2(key)) % partition_count`: Kafka's default partitioner."""
    if partition_count < 1:
        raise ValueError(f"partition_count must be at least 1, got {partition_count}")
    return (es_murmur2(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)) & 0x7FFFFFFF) % partition_count


cdef inline str _ascii(const char *data, Py_ssize_t length):
    """A str of ASCII bytes the caller vouches for, without the decoder's checks."""
    text = PyUnicode_New(length, 127)
    memcpy(PyUnicode_DATA(text), data, length)
    return text


include "envelope.pxi"
include "ids.pxi"
include "ring.pxi"
include "mapped_file.pxi"
include "route.pxi"
include "delivery.pxi"
include "intake.pxi"
include "frames.pxi"
include "busy_poll.pxi"
include "wire.pxi"
include "queued_calls.pxi"
include "in_person.pxi"
include "listener.pxi"
include "transfer.pxi"
include "record.pxi"
include "handoff.pxi"
