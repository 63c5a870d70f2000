# The consumer's Record, built in C: a worker makes one per event, and a frozen dataclass
# cost more to construct (1.7 us) than everything else the worker does for a no-op event.

cimport cython
from cpython.number cimport PyNumber_Index


@cython.final
@cython.freelist(64)
cdef class Record:
    """One event as a handler sees it.

    `attempt` is 1 on the first delivery to a handler and grows with each retry, so a
    handler can tell a redelivery (after its own failure or a worker's death) apart.
    """

    cdef readonly object topic
    cdef readonly long long partition
    cdef readonly long long offset
    cdef readonly object key
    cdef readonly object value
    cdef readonly object headers
    cdef readonly object create_time_ms
    cdef readonly object event_id
    cdef readonly long long attempt

    __match_args__ = ("topic", "partition", "offset", "key", "value", "headers",
                      "create_time_ms", "event_id", "attempt")

    def __init__(self, object topic, object partition, object offset, object key,
                 object value, object headers, object create_time_ms, object event_id,
                 object attempt=1):
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        # operator.index semantics: an int, or what stands for one, never a float cut short
        self._fill(topic, _index(partition), _index(offset), key, value, headers,
                   create_time_ms, event_id, _index(attempt))

    cdef void _fill(self, object topic, long long partition, long long offset, object key,
                    object value, object headers, object create_time_ms, object event_id,
                    long long attempt):
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.create_time_ms = create_time_ms
        self.event_id = event_id
        self.attempt = attempt

    def header(self, name):
        """The last value of header `name`, or None."""
        if self.headers:
            for header_name, value in reversed(self.headers):
                if header_name == name:
                    return value
        return None

    def with_attempt(self, attempt):
        """The same event, delivered for the `attempt`-th time."""
        return _record(self.topic, self.partition, self.offset, self.key, self.value,
                       self.headers, self.create_time_ms, self.event_id, _index(attempt))

    cdef tuple _fields(self):
        return (self.topic, self.partition, self.offset, self.key, self.value, self.headers,
                self.create_time_ms, self.event_id, self.attempt)

    def __eq__(self, other):
        if type(other) is not Record:
            return NotImplemented
        return self._fields() == (<Record>other)._fields()

    def __hash__(self):
        return hash(self._fields())

    def __reduce__(self):
        return Record, self._fields()

    def __repr__(self):
        return ("Record(topic=%r, partition=%r, offset=%r, key=%r, value=%r, headers=%r, "
                "create_time_ms=%r, event_id=%r, attempt=%r)" % self._fields())


cdef long long _index(object number) except? -1:
    return PyNumber_Index(number)


cdef Record _record(object topic, long long partition, long long offset, object key,
                    object value, object headers, object create_time_ms, object event_id,
                    long long attempt):
    cdef Record record = Record.__new__(Record)
    record._fill(topic, partition, offset, key, value, headers, create_time_ms, event_id,
                 attempt)
    return record


cdef object _event_id(object headers):
    """The last `event_id` header with a value, as text."""
    cdef object event_id = None
    if headers:
        for name, value in headers:
            if name == EVENT_ID_HEADER and value is not None:
                event_id = (<bytes>value).decode("ascii", "replace")
    return event_id


def decode_part(bytes blob not None, str topic not None, long long partition):
    """The Records (first attempts) of a blob made by split_keyed for one partition; the
    create time and event id follow the rule of eventspool.consumer.record."""
    return list(PartRecords(blob, topic, partition))


@cython.final
cdef class PartRecords:
    """The Records of a blob made by split_keyed for one partition, made one at a time as
    they are taken.

    A worker that runs each event before it makes the next keeps none of them alive
    while the cyclic collector runs. A part decoded whole was promoted through the
    collector's generations and swept again and again: over half of a worker's time for
    a cheap handler. The blob is checked whole up front (`count`), so a damaged one is
    refused before any of its events runs.
    """

    cdef bytes blob
    cdef _Reader reader
    cdef str topic
    cdef long long partition
    cdef readonly Py_ssize_t count
    cdef Py_ssize_t made

    def __cinit__(self, bytes blob not None, str topic not None, long long partition):
        self.blob = blob
        self.topic = topic
        self.partition = partition
        self.count = _count_records(_blob_reader(blob))
        self.reader = _blob_reader(blob)

    def __iter__(self):
        return self

    def __length_hint__(self):
        return self.count - self.made

    def __next__(self):
        if self.reader.pos >= self.reader.size:
            raise StopIteration
        offset, key, value, headers, (timestamp_type, stamp) = _read_record(self.reader)
        self.made += 1
        return _record(self.topic, self.partition, offset, key, value, headers,
                       _create_time_ms(headers, timestamp_type, stamp), _event_id(headers), 1)


cdef Py_ssize_t _count_records(_Reader reader) except -1:
    """The records in a blob, walking it as _read_record reads it: whatever would fail
    there (a length that overruns, a header name that is not UTF-8) fails here."""
    cdef Py_ssize_t count = 0
    cdef uint16_t headers, name_length, i
    while reader.pos < reader.size:
        reader.need(20)
        reader.pos += 20
        _skip_field(reader)
        _skip_field(reader)
        reader.need(1)
        reader.pos += 1
        if reader.data[reader.pos - 1]:
            reader.need(2)
            headers = es_get_u16(reader.data + reader.pos)
            reader.pos += 2
            for i in range(headers):
                reader.need(2)
                name_length = es_get_u16(reader.data + reader.pos)
                reader.pos += 2
                reader.need(name_length)
                PyUnicode_DecodeUTF8(reader.data + reader.pos, name_length, NULL)
                reader.pos += name_length
                _skip_field(reader)
        count += 1
    return count


cdef int _skip_field(_Reader reader) except -1:
    cdef int32_t length = _blob_length(reader)
    if length > 0:
        reader.need(length)
        reader.pos += length
    return 0
