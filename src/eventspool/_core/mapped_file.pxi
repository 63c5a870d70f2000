# A new ring file, created and mapped in one call without the interpreter lock, and the
# rename that puts a spare into its queue's chain. Included by native.pyx; ring.py and
# spares.py turn a failure into their own errors.
#
# Why one call: a spare segment is made on a background thread while a writer runs
# compiled appends holding the interpreter lock. Each time that thread lets go of the
# lock (every syscall of os.open, posix_fallocate, mmap...) it waits a whole switch
# interval to have it back, so a segment made in Python steps came later than the writer
# needed it. Here the creation, the reservation, the header and the touch of every page
# are one stretch without the lock.

cdef enum:
    STEP_CREATE = 1
    STEP_RESERVE = 2
    STEP_MAP = 3

# The step of MappedFile.create that failed (0: none), given with its errno.
MAP_CREATE = STEP_CREATE
MAP_RESERVE = STEP_RESERVE
MAP_MAP = STEP_MAP


cdef class MappedFile:
    """A ring file's shared, writable mapping, made by `create` with every page touched.

    RingQueue (ring.py) maps it as it would an mmap: it takes over the file descriptor
    (`fd`, which `close` leaves open) and reads the header through the buffer.
    """

    cdef char *_data
    cdef Py_ssize_t _exports
    cdef readonly Py_ssize_t size
    cdef readonly int fd
    cdef readonly uint64_t allocated

    def __cinit__(self):
        self._data = NULL
        self.fd = -1

    def __dealloc__(self):
        if self._data != NULL:
            mman.munmap(self._data, self.size)

    def create(self, bytes path not None, bytes header not None, Py_ssize_t size) -> tuple:
        """Create `path` (truncated if it exists) of `size` bytes: reserved with
        posix_fallocate (never sparse: a write into a hole of a full disk through a
        mapping is a SIGBUS), `header` written at its start, every page written once.

        Returns (0, 0), or the step that failed (MAP_CREATE, MAP_RESERVE, MAP_MAP) and its
        errno; the file is then removed. Nothing is synced.
        """
        cdef const char *name = PyBytes_AS_STRING(path)
        cdef const char *head = PyBytes_AS_STRING(header)
        cdef Py_ssize_t head_size = PyBytes_GET_SIZE(header)
        cdef int fd, step = 0, error = 0
        cdef void *data = mman.MAP_FAILED
        cdef struct_stat info
        if self._data != NULL or self.fd >= 0:
            raise ValueError("the mapping was created already")
        if size < head_size or size <= 0:
            raise ValueError(f"a file of {size} bytes cannot hold a {head_size}-byte header")
        with nogil:
            fd = fcntl.open(name, fcntl.O_RDWR | fcntl.O_CREAT | fcntl.O_TRUNC | fcntl.O_CLOEXEC, 0o640)
            if fd < 0:
                step, error = STEP_CREATE, errno
            else:
                error = fcntl.posix_fallocate(fd, 0, size)  # returns the error, not -1
                if error == 0 and fstat(fd, &info) != 0:
                    error = errno
                if error != 0:
                    step = STEP_RESERVE
                else:
                    data = mman.mmap(NULL, size, mman.PROT_READ | mman.PROT_WRITE, mman.MAP_SHARED, fd, 0)
                    if data == mman.MAP_FAILED:
                        step, error = STEP_MAP, errno
                if step == 0:
                    memcpy(data, head, head_size)
                    es_fault_in_writable(<char *>data, size)
                else:
                    unistd.close(fd)
                    unistd.unlink(name)
        if step:
            return step, error
        self._data = <char *>data
        self.size = size
        self.fd = fd
        self.allocated = <uint64_t>info.st_blocks * 512
        return 0, 0

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        if self._data == NULL:
            raise ValueError("the mapping is closed")
        PyBuffer_FillInfo(buffer, self, self._data, self.size, 0, flags)
        self._exports += 1

    def __releasebuffer__(self, Py_buffer *buffer):
        self._exports -= 1

    def close(self) -> None:
        """Unmap the file (its descriptor stays open: RingQueue closes it)."""
        cdef void *data = self._data
        if self._exports:
            raise BufferError("the mapping is still in use")
        if data == NULL:
            return
        self._data = NULL
        with nogil:
            mman.munmap(data, self.size)


def rename_holding_gil(bytes source not None, bytes target not None) -> int:
    """rename(2) without letting go of the interpreter lock: its errno, 0 when done.

    For the writer that renames a spare into its queue's chain (spares.py): a rename is
    a metadata change of microseconds, while a thread that lets go of the interpreter
    lock waits, as other threads want it, up to a switch interval to have it back.
    """
    if stdio.rename(PyBytes_AS_STRING(source), PyBytes_AS_STRING(target)) != 0:
        return errno
    return 0
