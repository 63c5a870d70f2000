# The consumer's hand-over of key-ordered records from its poll thread to its workers.
#
# A poll's records are split into runs (one partition's consecutive keyed records, up to
# `cap`), and each run's records are sorted into one blob per worker by the hash of their
# key. A blob replaces a pickled list of record tuples: the poll thread touches each
# record once in C, and the worker rebuilds the tuples in C. Layout of one record in a
# blob, little-endian:
#
#   i64 offset | i32 timestamp type | i64 timestamp
#   i32 key length (-1: None) | key | i32 value length (-1: None) | value
#   u8 1 if the record has headers (even none), else 0; then, if 1, the headers block of
#   an envelope: u16 count | per header: u16 name length | name (UTF-8)
#                                        | i32 value length (-1: None) | value

from cpython.mem cimport PyMem_Free, PyMem_Realloc


cdef extern from "Python.h":
    ctypedef struct PyMethodDef:
        void *ml_meth
        int ml_flags
    ctypedef struct PyMethodDescrObject:
        PyMethodDef *d_method
    enum:
        METH_NOARGS


# A C method without arguments, called through its C function: new reference, or NULL
# with the exception set (which Cython raises).
ctypedef object (*_NoArgs)(object, void *)
_METHOD_DESCRIPTOR = type(str.upper)


cdef class _Getters:
    """The getters split_keyed calls on every message, for one message type.

    confluent_kafka's Message getters are C methods without arguments. Calling their C
    functions directly skips the method lookup and the call protocol, seven times per
    record: a third of split_keyed's instructions per record. Only a C method the type
    defines itself is called so: on any other object (a subclass, a test's stand-in,
    a class that borrows another type's method) the getters are called by name.
    """

    cdef type of
    cdef _NoArgs key
    cdef _NoArgs topic
    cdef _NoArgs partition
    cdef _NoArgs offset
    cdef _NoArgs headers
    cdef _NoArgs timestamp
    cdef _NoArgs value

    @staticmethod
    cdef _Getters of_type(type of):
        cdef _Getters getters = _Getters.__new__(_Getters)
        getters.of = of
        getters.key = _no_args_function(of, "key")
        getters.topic = _no_args_function(of, "topic")
        getters.partition = _no_args_function(of, "partition")
        getters.offset = _no_args_function(of, "offset")
        getters.headers = _no_args_function(of, "headers")
        getters.timestamp = _no_args_function(of, "timestamp")
        getters.value = _no_args_function(of, "value")
        return getters


cdef _NoArgs _no_args_function(type of, str name):
    """The C function of `of.name` if `of` defines it as a C method without arguments,
    else NULL. Calling it skips the check that `self` is of the method's own type, so a
    method `of` has from elsewhere (a base class, or another type's borrowed) is not
    taken: a subclass may override it, and another type's would read the wrong object."""
    descriptor = getattr(of, name, None)
    if type(descriptor) is not _METHOD_DESCRIPTOR or descriptor.__objclass__ is not of:
        return NULL
    cdef PyMethodDef *method = (<PyMethodDescrObject *>descriptor).d_method
    if method.ml_flags != METH_NOARGS:
        return NULL
    return <_NoArgs>method.ml_meth


def calls_getters_directly(type message_type) -> bool:
    """Whether split_keyed calls every getter of `message_type` through its C function."""
    cdef _Getters getters = _Getters.of_type(message_type)
    return (
        getters.key != NULL and getters.topic != NULL and getters.partition != NULL
        and getters.offset != NULL and getters.headers != NULL
        and getters.timestamp != NULL and getters.value != NULL
    )


cdef inline object _get(_NoArgs function, object message, str name):
    if function != NULL:
        return function(message, NULL)
    return getattr(message, name)()


cdef class _Blob:
    """A growing byte buffer for one worker's share of a run."""

    cdef char *data
    cdef Py_ssize_t size
    cdef Py_ssize_t capacity
    cdef Py_ssize_t count

    def __dealloc__(self):
        PyMem_Free(self.data)

    cdef char *reserve(self, Py_ssize_t n) except NULL:
        cdef Py_ssize_t want = self.size + n
        cdef Py_ssize_t capacity = self.capacity if self.capacity else 4096
        cdef char *grown
        if want > self.capacity:
            while capacity < want:
                capacity *= 2
            grown = <char *>PyMem_Realloc(self.data, capacity)
            if grown == NULL:
                raise MemoryError()
            self.data = grown
            self.capacity = capacity
        cdef char *at = self.data + self.size
        self.size = want
        return at

    cdef void put_record(self, int64_t offset, object timestamp, object key, object value,
                         object headers) except *:
        """Size the record first, so it is one reservation and plain stores."""
        cdef Py_ssize_t size = 8 + 4 + 8 + 4 + _field_size(key) + 4 + _field_size(value) + 1
        cdef Py_ssize_t header_count = 0
        cdef Py_ssize_t name_size
        cdef const char *name_data
        cdef char *at
        if type(timestamp) is not tuple or len(<tuple>timestamp) != 2:
            raise TypeError(f"a record timestamp must be a (type, ms) tuple, not {timestamp!r}")
        if headers is not None:
            if type(headers) is not list:
                raise TypeError(f"record headers must be a list, not {type(headers).__name__}")
            header_count = len(<list>headers)
            if header_count > 0xFFFF:
                raise ValueError("a record with over 65535 headers cannot be handed to a worker")
            size += 2
            for header in <list>headers:
                # Tuples only: unpacking anything else could run Python code that changes
                # the list between this sizing pass and the writing pass below.
                if type(header) is not tuple or len(<tuple>header) != 2:
                    raise TypeError(f"a record header must be a (name, value) tuple, not {header!r}")
                name, header_value = <tuple>header
                if type(name) is not str:
                    raise TypeError(f"a record header name must be str, not {type(name).__name__}")
                PyUnicode_AsUTF8AndSize(name, &name_size)
                if name_size > 0xFFFF:
                    raise ValueError("a header name over 65535 bytes cannot go to a worker")
                size += 2 + name_size + 4 + _field_size(header_value)
        at = self.reserve(size)
        es_put_u64(at, <uint64_t>offset)
        es_put_u32(at + 8, <uint32_t><int32_t>(<tuple>timestamp)[0])
        es_put_u64(at + 12, <uint64_t><int64_t>(<tuple>timestamp)[1])
        at = _put_field(at + 20, key)
        at = _put_field(at, value)
        if headers is None:
            at[0] = 0
        else:
            at[0] = 1
            es_put_u16(at + 1, <uint16_t>header_count)
            at += 3
            for name, header_value in <list>headers:
                name_data = PyUnicode_AsUTF8AndSize(name, &name_size)
                es_put_u16(at, <uint16_t>name_size)
                memcpy(at + 2, name_data, name_size)
                at = _put_field(at + 2 + name_size, header_value)
        self.count += 1

    cdef object take(self):
        if not self.count:
            return None
        return PyBytes_FromStringAndSize(self.data, self.size), self.count


cdef inline Py_ssize_t _field_size(object value) except -1:
    """The bytes a key, value or header value takes after its i32 length."""
    if value is None:
        return 0
    if type(value) is not bytes:
        raise TypeError(f"record fields must be bytes or None, not {type(value).__name__}")
    if PyBytes_GET_SIZE(value) > 0x7FFFFFFF:
        raise ValueError("a record field over 2 GiB cannot be handed to a worker")
    return PyBytes_GET_SIZE(value)


cdef inline char *_put_field(char *at, object value):
    """i32 length (-1: None) and the bytes; `_field_size` has checked the value."""
    cdef Py_ssize_t n
    if value is None:
        es_put_u32(at, <uint32_t>(-1))
        return at + 4
    n = PyBytes_GET_SIZE(value)
    es_put_u32(at, <uint32_t>n)
    memcpy(at + 4, PyBytes_AS_STRING(value), n)
    return at + 4 + n


cdef object _create_time_ms(object headers, int32_t timestamp_type, int64_t stamp):
    """The envelope's create_time header (the last one with a value; one that does not
    parse counts as none), else the record's create timestamp: the same rule as
    eventspool.consumer.record."""
    cdef object created = None
    if headers:
        for name, value in headers:
            if name == "create_time" and value is not None:
                try:
                    created = int(value)
                except ValueError:
                    created = None
    if created is None and timestamp_type == 1:  # TIMESTAMP_CREATE_TIME
        created = stamp
    return created


def split_keyed(list messages, Py_ssize_t workers, Py_ssize_t cap, dict ends,
                object oldest_ms):
    """Split one poll's messages for key-ordered hand-over.

    Returns, in poll order, keyless messages (and errors) as they are, and runs as
    tuples (topic, partition, first offset, end offset, count, blobs, stale): `blobs`
    holds a (blob, records in it) pair per worker (None if it gets nothing), `stale` the records created
    before `oldest_ms` as (offset, key, value, headers, timestamp) tuples. `ends` maps
    each assigned (topic, partition) to the offset after the last one taken before (or
    None); records of other partitions, and refetched ones below that end, are skipped.
    Every record of a run counts in `count`, stale ones too.
    """
    cdef list out = []
    cdef list blobs = None
    cdef list stale = None
    cdef object topic = None
    cdef object key
    cdef object run_topic = None
    cdef long long run_partition = -1
    cdef long long partition
    cdef long long offset
    cdef long long first = -1
    cdef long long end = -1
    cdef bint has_end = False
    cdef bint assigned = False
    cdef Py_ssize_t count = 0
    cdef _Blob blob
    cdef object created
    cdef _Getters get = None
    for message in messages:
        if get is None or type(message) is not get.of:
            get = _Getters.of_type(type(message))
        key = _get(get.key, message, "key")
        if key is None:
            if blobs is not None and count:
                out.append(_run(ends, run_topic, run_partition, first, end, count, blobs, stale))
            blobs = None
            out.append(message)
            continue
        topic = _get(get.topic, message, "topic")
        partition = _get(get.partition, message, "partition")
        if (blobs is None or partition != run_partition or topic != run_topic
                or count >= cap):
            if blobs is not None and count:
                out.append(_run(ends, run_topic, run_partition, first, end, count, blobs, stale))
            if blobs is None or partition != run_partition or topic != run_topic:
                tp = (topic, partition)
                assigned = tp in ends
                previous_end = ends.get(tp)
                has_end = previous_end is not None
                if has_end:
                    end = previous_end
            run_topic = topic
            run_partition = partition
            blobs = [_Blob() for _ in range(workers)]
            stale = []
            count = 0
        if not assigned:
            continue
        offset = _get(get.offset, message, "offset")
        if has_end and offset < end:
            continue
        if not count:
            first = offset
        end = offset + 1
        has_end = True
        count += 1
        headers = _get(get.headers, message, "headers")
        timestamp = _get(get.timestamp, message, "timestamp")
        if oldest_ms is not None:
            created = _create_time_ms(headers, timestamp[0], timestamp[1])
            if created is not None and created < oldest_ms:
                stale.append((offset, key, _get(get.value, message, "value"), headers, timestamp))
                continue
        if type(key) is not bytes:
            raise TypeError(f"record keys must be bytes, not {type(key).__name__}")
        blob = <_Blob>blobs[es_crc32_ieee(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)) % workers]
        blob.put_record(offset, timestamp, key, _get(get.value, message, "value"), headers)
    if blobs is not None and count:
        out.append(_run(ends, run_topic, run_partition, first, end, count, blobs, stale))
    return out


cdef tuple _run(dict ends, object topic, long long partition, long long first, long long end,
                Py_ssize_t count, list blobs, list stale):
    ends[(topic, partition)] = end  # a later run of the partition in this poll starts here
    return (topic, partition, first, end, count, [(<_Blob>b).take() for b in blobs], stale)


def decode_records(bytes blob not None):
    """The (offset, key, value, headers, timestamp) tuples of a blob made by split_keyed."""
    cdef _Reader reader = _blob_reader(blob)
    cdef list records = []
    while reader.pos < reader.size:
        records.append(_read_record(reader))
    return records


cdef _Reader _blob_reader(bytes blob):
    cdef _Reader reader = _Reader.__new__(_Reader)
    reader.data = PyBytes_AS_STRING(blob)
    reader.size = PyBytes_GET_SIZE(blob)
    reader.pos = 0
    return reader


cdef tuple _read_record(_Reader reader):
    """The next record of a blob as (offset, key, value, headers, (timestamp type, ms))."""
    cdef int64_t offset
    cdef int32_t timestamp_type
    cdef int64_t stamp
    cdef uint8_t has_headers
    reader.need(20)
    offset = <int64_t>es_get_u64(reader.data + reader.pos)
    timestamp_type = <int32_t>es_get_u32(reader.data + reader.pos + 8)
    stamp = <int64_t>es_get_u64(reader.data + reader.pos + 12)
    reader.pos += 20
    key = reader.take(_blob_length(reader))
    value = reader.take(_blob_length(reader))
    reader.need(1)
    has_headers = <uint8_t>reader.data[reader.pos]
    reader.pos += 1
    headers = reader.headers() if has_headers else None
    return offset, key, value, headers, (timestamp_type, stamp)


cdef int32_t _blob_length(_Reader reader) except? -2:
    cdef int32_t length
    reader.need(4)
    length = <int32_t>es_get_u32(reader.data + reader.pos)
    reader.pos += 4
    if length < -1:
        raise ValueError(f"negative field length {length} at offset {reader.pos - 4}")
    return length
