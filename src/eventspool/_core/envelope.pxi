# The event envelope (layout: eventspool/envelope.py). Included by native.pyx.
#
#     0   1   version (1)        1   1   flags: bit 0 = headers follow the value
#     2   36  event_id text      38  8   create time ms (signed)
#     46  4   key length (-1)    50  4   value length (-1: tombstone)
#     54  ... key, value, then the header block when flag bit 0 is set:
#             u16 count, per header: u16 name length, name, i32 value length (-1), value

cdef enum:
    ENVELOPE_VERSION = 1
    FLAG_HEADERS = 1
    ID_LEN = 36
    FIXED = 54
    MAX_HEADERS = 0xFFFF

# For envelope.py and the wire protocol, which check events before they get here.
ENVELOPE_FIXED_SIZE = FIXED
ENVELOPE_MAX_HEADERS = MAX_HEADERS
EVENT_ID_SIZE = ID_LEN
# The Kafka header that carries an event's id, the text of its envelope's event_id field.
EVENT_ID_HEADER = "event_id"


cdef inline Py_ssize_t _envelope_size(Py_ssize_t klen, Py_ssize_t vlen, Py_ssize_t hlen) noexcept nogil:
    return FIXED + (klen if klen > 0 else 0) + (vlen if vlen > 0 else 0) + (hlen if hlen > 0 else 0)


cdef inline void _put_envelope(
    char *out, const char *event_id, int64_t create_ms,
    const char *key, Py_ssize_t klen, const char *value, Py_ssize_t vlen,
    const char *header_block, Py_ssize_t hlen,
) noexcept nogil:
    """Write one envelope at `out`; lengths of -1 mean None (no key, tombstone, no headers)."""
    cdef char *p = out + FIXED
    out[0] = ENVELOPE_VERSION
    out[1] = FLAG_HEADERS if hlen > 0 else 0
    memcpy(out + 2, event_id, ID_LEN)
    es_put_u64(out + 38, <uint64_t>create_ms)
    es_put_u32(out + 46, <uint32_t><int32_t>klen)
    es_put_u32(out + 50, <uint32_t><int32_t>vlen)
    if klen > 0:
        memcpy(p, key, klen)
        p += klen
    if vlen > 0:
        memcpy(p, value, vlen)
        p += vlen
    if hlen > 0:
        memcpy(p, header_block, hlen)


def encode_headers(list headers not None) -> bytes:
    """The header block of an envelope from (str name, bytes | None value) pairs."""
    cdef Py_ssize_t count = len(headers), size = 2, name_len, i
    cdef const char *name
    cdef object value
    if count > MAX_HEADERS:
        raise ValueError(f"{count} headers; at most {MAX_HEADERS} are allowed")
    names = []
    for item in headers:
        raw = (<str>item[0]).encode()
        names.append(raw)
        value = item[1]
        size += 2 + PyBytes_GET_SIZE(raw) + 4 + (0 if value is None else PyBytes_GET_SIZE(value))
    block = PyBytes_FromStringAndSize(NULL, size)
    cdef char *p = PyBytes_AS_STRING(block)
    es_put_u16(p, <uint16_t>count)
    p += 2
    for i in range(count):
        raw = names[i]
        value = headers[i][1]
        name_len = PyBytes_GET_SIZE(raw)
        es_put_u16(p, <uint16_t>name_len)
        memcpy(p + 2, PyBytes_AS_STRING(raw), name_len)
        p += 2 + name_len
        if value is None:
            es_put_u32(p, 0xFFFFFFFF)
            p += 4
        else:
            es_put_u32(p, <uint32_t>PyBytes_GET_SIZE(value))
            memcpy(p + 4, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))
            p += 4 + PyBytes_GET_SIZE(value)
    return block


def encode(bytes event_id not None, int64_t create_time_ms, object key, object value, object headers) -> bytes:
    """The payload of one event; the caller has checked the types (envelope.py)."""
    cdef Py_ssize_t klen, vlen, hlen = -1
    cdef const char *hdr = NULL
    if PyBytes_GET_SIZE(event_id) != ID_LEN:
        raise ValueError(f"event_id must be {ID_LEN} bytes, got {PyBytes_GET_SIZE(event_id)}")
    cdef const char *k = _bytes_or_null(key, &klen)
    cdef const char *v = _bytes_or_null(value, &vlen)
    block = None
    if headers:
        block = encode_headers(headers)
        hdr = PyBytes_AS_STRING(block)
        hlen = PyBytes_GET_SIZE(block)
    out = PyBytes_FromStringAndSize(NULL, _envelope_size(klen, vlen, hlen))
    _put_envelope(PyBytes_AS_STRING(out), PyBytes_AS_STRING(event_id), create_time_ms, k, klen, v, vlen, hdr, hlen)
    return out


cdef class _Reader:
    """Bounds-checked reads of one envelope; every overrun is a ValueError."""

    cdef const char *data
    cdef Py_ssize_t size
    cdef Py_ssize_t pos

    cdef inline int need(self, Py_ssize_t n) except -1:
        if n < 0 or self.pos + n > self.size:
            raise ValueError(f"field of length {n} at offset {self.pos} overruns the envelope")
        return 0

    cdef object take(self, int32_t length):
        if length == -1:
            return None
        self.need(length)
        out = PyBytes_FromStringAndSize(self.data + self.pos, length)
        self.pos += length
        return out

    cdef list headers(self):
        cdef uint16_t count, name_len, i
        self.need(2)
        count = es_get_u16(self.data + self.pos)
        self.pos += 2
        out = []
        for i in range(count):
            self.need(2)
            name_len = es_get_u16(self.data + self.pos)
            self.pos += 2
            self.need(name_len)
            name = PyUnicode_DecodeUTF8(self.data + self.pos, name_len, NULL)
            self.pos += name_len
            self.need(4)
            length = <int32_t>es_get_u32(self.data + self.pos)
            self.pos += 4
            out.append((name, self.take(length)))
        return out


cdef tuple _decode(const char *data, Py_ssize_t size, bint strict):
    """(event_id bytes, create ms, key, value, headers or None) of one envelope."""
    cdef _Reader reader
    if size < FIXED:
        raise ValueError(f"envelope of {size} bytes is shorter than its fixed part")
    if <uint8_t>data[0] != ENVELOPE_VERSION:
        raise ValueError(f"unknown envelope version {<uint8_t>data[0]}")
    reader = _Reader.__new__(_Reader)
    reader.data = data
    reader.size = size
    reader.pos = FIXED
    raw_id = PyBytes_FromStringAndSize(data + 2, ID_LEN)
    create_ms = <int64_t>es_get_u64(data + 38)
    key = reader.take(<int32_t>es_get_u32(data + 46))
    value = reader.take(<int32_t>es_get_u32(data + 50))
    headers = reader.headers() if data[1] & FLAG_HEADERS else None
    if strict and reader.pos != size:
        raise ValueError(f"envelope has {size - reader.pos} trailing bytes")
    return raw_id, create_ms, key, value, headers


def decode_fields(payload) -> tuple:
    """Parse a whole payload strictly: (event_id str, create ms, key, value, headers)."""
    cdef Py_buffer view
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        raw_id, create_ms, key, value, headers = _decode(<const char *>view.buf, view.len, True)
    except UnicodeDecodeError as exc:
        raise ValueError(f"malformed envelope: {exc}") from exc
    finally:
        PyBuffer_Release(&view)
    return raw_id.decode("ascii"), create_ms, key, value, headers


def decode_for_kafka(bytes payload not None) -> tuple:
    """(event_id bytes, create ms, key, value, headers or None): what a Kafka record needs."""
    try:
        return _decode(PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), False)
    except UnicodeDecodeError as exc:
        raise ValueError(f"malformed envelope: {exc}") from exc
