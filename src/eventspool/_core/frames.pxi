# The wire's framing, for the agent and the client alike: whole frames cut out of a byte
# stream. Included by native.pyx. The format is written out in eventspool/wire/protocol.py,
# whose FrameDecoder keeps the partial frame between reads and words the faults.

# What stopped `split_frames` short of the end of its bytes, if anything did.
FRAME_FAULT_NONE = 0
FRAME_FAULT_TOO_LARGE = 1
FRAME_FAULT_TOO_SMALL = 2
FRAME_FAULT_UNKNOWN_TYPE = 3


cdef class Frame:
    """One frame with its length stripped; the body is not parsed yet.

    Compiled because both ends make one per frame: as a frozen dataclass its
    construction was a tenth of the agent's Python per event (profiled with 16 callers).
    """

    cdef readonly object type
    cdef readonly object request_id
    cdef readonly bytes body

    def __init__(self, type, request_id, bytes body not None):
        self.type = type
        self.request_id = request_id
        self.body = body

    def __repr__(self):
        return f"Frame(type={self.type!r}, request_id={self.request_id!r}, body={self.body!r})"

    def __eq__(self, other):
        if type(other) is not Frame:
            return NotImplemented
        theirs = <Frame>other
        return (self.type, self.request_id, self.body) == (theirs.type, theirs.request_id, theirs.body)

    def __hash__(self):
        return hash((self.type, self.request_id, self.body))


cdef inline const char *_stream_bytes(object data, Py_ssize_t *size) except NULL:
    """The bytes of a bytes or bytearray object, in place."""
    if type(data) is bytes:
        size[0] = PyBytes_GET_SIZE(data)
        return PyBytes_AS_STRING(data)
    if type(data) is bytearray:
        size[0] = PyByteArray_GET_SIZE(data)
        return PyByteArray_AS_STRING(data)
    raise TypeError(f"expected bytes or bytearray, got {type(data).__name__}")


def split_frames(object data not None, Py_ssize_t max_frame, tuple types not None, list frames not None):
    """Append every whole frame at the start of `data` (bytes or bytearray) to `frames`:
    (bytes consumed, fault, value).

    A frame's type is `types[raw type]`; None marks a type the protocol does not know. A
    length prefix is judged as soon as its four bytes are there, before its body is.
    `fault` is FRAME_FAULT_NONE when it stopped at a partial frame (or the end), else what
    is wrong with the frame at `consumed`: too large or too small (`value` is its
    length), or of an unknown type (`value` is the type's byte).
    """
    cdef Py_ssize_t size, pos = 0, end
    cdef const char *p = _stream_bytes(data, &size)
    cdef uint32_t length
    cdef uint8_t raw_type
    cdef Frame frame
    if len(types) != 256:
        raise ValueError(f"types must have 256 entries, not {len(types)}")
    while size - pos >= FRAME_LENGTH_SIZE:
        length = es_get_be32(p + pos)
        if length > max_frame:
            return pos, FRAME_FAULT_TOO_LARGE, length
        if length < FRAME_MIN_LENGTH:
            return pos, FRAME_FAULT_TOO_SMALL, length
        if size - pos == FRAME_LENGTH_SIZE:
            break
        raw_type = <uint8_t>p[pos + FRAME_LENGTH_SIZE]
        frame_type = types[raw_type]
        if frame_type is None:
            return pos, FRAME_FAULT_UNKNOWN_TYPE, raw_type
        end = pos + FRAME_LENGTH_SIZE + length
        if end > size:
            break
        frame = Frame.__new__(Frame)
        frame.type = frame_type
        frame.request_id = es_get_be32(p + pos + FRAME_LENGTH_SIZE + 1)
        frame.body = PyBytes_FromStringAndSize(p + pos + FRAME_HEADER_SIZE, length - FRAME_MIN_LENGTH)
        frames.append(frame)
        pos = end
    return pos, FRAME_FAULT_NONE, 0
