# The client's side of the wire: one event of a SEND (or PUBLISH) body, encoded when
# the caller hands it over, so a queued event is a bytes object and a frame is a join.
# Included by native.pyx. The format is written out in eventspool/wire/protocol.py.

cdef enum:
    MAX_WIRE_U16 = 0xFFFF
    MAX_WIRE_I32 = 0x7FFFFFFF


cdef inline Py_ssize_t _wire_length(object data, str what) except -2:
    """The length of a field (-1 for None), refused when its u32 length cannot say it."""
    if data is None:
        return -1
    cdef Py_ssize_t length = PyBytes_GET_SIZE(<bytes>data)
    if <uint64_t>length > 0xFFFFFFFF:
        raise ValueError(f"{what} of {length} bytes is too large")
    return length


cdef inline char *_put_wire_field(char *p, object data, Py_ssize_t length) noexcept:
    if length < 0:
        return p
    es_put_be32(p, <uint32_t>length)
    memcpy(p + 4, PyBytes_AS_STRING(<bytes>data), length)
    return p + 4 + length


def encode_wire_event(bytes value, bytes key, object headers, str event_id) -> bytes:
    """One event as a SEND body carries it: flags, key, value, headers, event_id.

    `headers` are (str name, bytes | None value) pairs; subclasses of str and bytes
    count as such. Raises ValueError, naming the field, for what the format cannot
    carry (the caller adds which event it was), TypeError for other types.
    """
    cdef Py_ssize_t klen = _wire_length(key, "key")
    cdef Py_ssize_t vlen = _wire_length(value, "value")
    cdef Py_ssize_t size = 1, count = 0, i, length
    cdef uint8_t flags = (WIRE_KEY if klen >= 0 else 0) | (WIRE_VALUE if vlen >= 0 else 0)
    cdef list names = None
    cdef list values = None
    cdef bytes raw_id = None
    cdef char *p
    if klen >= 0:
        size += 4 + klen
    if vlen >= 0:
        size += 4 + vlen
    if headers is not None:
        flags |= WIRE_HEADERS
        headers = list(headers)
        count = len(headers)
        if count > MAX_WIRE_U16:
            raise ValueError(f"{count} headers; at most {MAX_WIRE_U16} are allowed")
        names = [None] * count
        values = [None] * count
        size += 2
        for i in range(count):
            name, header_value = headers[i]
            if not isinstance(name, str):
                raise TypeError(f"header name must be a str, got {type(name).__name__}")
            if header_value is not None and not isinstance(header_value, bytes):
                raise TypeError(
                    f"header {name!r} value must be bytes or None, got "
                    f"{type(header_value).__name__}"
                )
            try:
                raw_name = PyUnicode_AsUTF8String(name)
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"header name {name!r} is not encodable as UTF-8: {exc.reason}"
                ) from None
            if PyBytes_GET_SIZE(raw_name) > MAX_WIRE_U16:
                raise ValueError(
                    f"header name of {PyBytes_GET_SIZE(raw_name)} bytes; at most "
                    f"{MAX_WIRE_U16} are allowed"
                )
            length = -1 if header_value is None else PyBytes_GET_SIZE(header_value)
            if length > MAX_WIRE_I32:
                raise ValueError(f"header {name!r} value of {length} bytes is too large")
            names[i] = raw_name
            values[i] = header_value  # the very objects measured are the ones copied
            size += 2 + PyBytes_GET_SIZE(raw_name) + 4 + (length if length > 0 else 0)
    if event_id is not None:
        flags |= WIRE_EVENT_ID
        raw_id = event_id.encode("ascii", "replace")
        if PyBytes_GET_SIZE(raw_id) != ID_LEN:
            raise ValueError(
                f"event_id {event_id!r} is not {ID_LEN} characters: a UUID in its canonical "
                "text form is"
            )
        size += ID_LEN
    out = PyBytes_FromStringAndSize(NULL, size)
    p = PyBytes_AS_STRING(out)
    p[0] = <char>flags
    p = _put_wire_field(p + 1, key, klen)
    p = _put_wire_field(p, value, vlen)
    if headers is not None:
        es_put_be16(p, <uint16_t>count)
        p += 2
        for i in range(count):
            raw_name = names[i]
            length = PyBytes_GET_SIZE(raw_name)
            es_put_be16(p, <uint16_t>length)
            memcpy(p + 2, PyBytes_AS_STRING(raw_name), length)
            p += 2 + length
            header_value = values[i]
            length = -1 if header_value is None else PyBytes_GET_SIZE(header_value)
            es_put_be32(p, <uint32_t><int32_t>length)
            p += 4
            if length > 0:
                memcpy(p, PyBytes_AS_STRING(header_value), length)
                p += length
    if raw_id is not None:
        memcpy(p, PyBytes_AS_STRING(raw_id), ID_LEN)
    return out
