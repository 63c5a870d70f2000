# The consumer's hand-off ring: parts' blobs from the poll process to one worker through
# shared memory. Included by native.pyx.

# The reader's position sits alone in the first cache line; the bytes follow it.
cdef enum:
    HANDOFF_HEADER = 64


cdef class Handoff:
    """One side of a byte ring in shared memory, with one writer and one reader.

    The poll thread `put`s a part's blob and sends only where it is over the worker's
    pipe; the worker's reader thread `take`s it, copying it out at once, which frees its
    room. Through the pipe, a blob is copied into the kernel and out again, and the
    worker unpickles it once more; here it is one copy in and one out. Positions count
    every byte ever put, so the one number the two sides share is how far the reader has
    taken; a blob never wraps (the end of the ring it does not fit in is skipped). `put`
    returns None when a blob does not fit in the room left: the caller sends it in the
    pipe, so the ring's size limits nothing but its own use.
    """

    cdef Py_buffer _view
    cdef bint _has_view
    cdef char *_data
    cdef uint64_t *_taken
    cdef readonly Py_ssize_t capacity
    cdef uint64_t _written

    def __cinit__(self, buffer) -> None:
        PyObject_GetBuffer(buffer, &self._view, PyBUF_WRITABLE)
        self._has_view = True
        if self._view.len <= HANDOFF_HEADER:
            raise ValueError(
                f"a hand-off ring needs more than {HANDOFF_HEADER} bytes, got {self._view.len}"
            )
        if <size_t>self._view.buf % 8:
            raise ValueError("a hand-off ring's buffer must be 8-byte aligned")
        self._taken = <uint64_t *>self._view.buf
        self._data = <char *>self._view.buf + HANDOFF_HEADER
        self.capacity = self._view.len - HANDOFF_HEADER
        self._written = es_load_acquire_u64(self._taken)

    def __dealloc__(self) -> None:
        if self._has_view:
            PyBuffer_Release(&self._view)

    def put(self, bytes blob not None):
        """Copy `blob` into the ring: its start position, or None when it does not fit."""
        cdef Py_ssize_t size = PyBytes_GET_SIZE(blob)
        cdef uint64_t capacity = <uint64_t>self.capacity
        cdef uint64_t start = self._written
        cdef uint64_t at = start % capacity
        if <uint64_t>size > capacity:
            return None
        if at + <uint64_t>size > capacity:
            start += capacity - at
            at = 0
        # Acquire: the reader's copy of what it took is done before that room is reused.
        if start + <uint64_t>size - es_load_acquire_u64(self._taken) > capacity:
            return None
        memcpy(self._data + at, PyBytes_AS_STRING(blob), size)
        self._written = start + <uint64_t>size
        return start

    def take(self, uint64_t start, Py_ssize_t size) -> bytes:
        """The `size` bytes put at `start`, copied out; their room is free from now on.
        Blobs must be taken in the order they were put."""
        cdef uint64_t capacity = <uint64_t>self.capacity
        cdef uint64_t at = start % capacity
        if size < 0 or at + <uint64_t>size > capacity:
            raise ValueError(f"no blob of {size} bytes at {start} in a ring of {capacity}")
        blob = PyBytes_FromStringAndSize(self._data + at, size)
        es_store_release_u64(self._taken, start + <uint64_t>size)
        return blob
