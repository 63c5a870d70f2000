# Event ids: UUIDv7 (RFC 9562) text. Included by native.pyx.
#
#     tttttttt-tttt-7ccc-vrrr-rrrrrrrrrrrr
#     t: 48-bit ms timestamp, c: 12-bit counter within the ms, v/r: variant 0b10 and 62
#     random bits drawn once per generator (and again in a forked child).

import os as _os
import weakref as _weakref

from eventspool.clock import SystemClock as _SystemClock

cdef char *_HEX = b"0123456789abcdef"


cdef inline void _hex(char *out, uint64_t value, int digits) noexcept nogil:
    cdef int i
    for i in range(digits - 1, -1, -1):
        out[i] = _HEX[value & 0xF]
        value >>= 4


cdef class EventIdGenerator:
    """Time-ordered, unique event ids with a 12-bit counter per millisecond.

    When more than 4096 ids are asked for within one millisecond the timestamp runs
    ahead, as RFC 9562 allows, so ids stay unique and sorted. Thread-safe: one id is
    made under the interpreter lock, without releasing it.
    """

    cdef object _clock
    cdef bint _system_clock
    cdef int64_t _last_ms
    cdef uint32_t _counter
    cdef char _text[ID_LEN]
    cdef object __weakref__

    def __init__(self, clock=None) -> None:
        self._clock = clock
        self._system_clock = clock is None or isinstance(clock, _SystemClock)
        self.reseed()
        _LIVE_GENERATORS.add(self)

    def reseed(self) -> None:
        """Draw new random bits: a forked child must not repeat its parent's ids."""
        cdef uint64_t tail = int.from_bytes(_os.urandom(8), "big")
        tail = (tail & ((<uint64_t>1 << 62) - 1)) | (<uint64_t>0b10 << 62)
        memcpy(self._text, b"00000000-0000-7000-0000-000000000000", ID_LEN)
        _hex(self._text + 19, tail >> 48, 4)
        _hex(self._text + 24, tail & 0xFFFFFFFFFFFF, 12)
        self._last_ms = -1

    cdef inline void make_into(self, int64_t now_ms, char *out) noexcept:
        """The next id's 36 characters, copied to `out`: a ring write may let go of the
        interpreter lock, and another thread's id would overwrite the generator's own."""
        if now_ms > self._last_ms:
            self._set_ms(now_ms)
            self._counter = 0
        else:
            self._counter += 1
            if self._counter > 0xFFF:
                self._set_ms(self._last_ms + 1)
                self._counter = 0
        _hex(self._text + 15, self._counter, 3)
        memcpy(out, self._text, ID_LEN)

    cdef inline void _set_ms(self, int64_t ms) noexcept:
        cdef uint64_t t = <uint64_t>ms & 0xFFFFFFFFFFFF
        self._last_ms = ms
        _hex(self._text, t >> 16, 8)
        _hex(self._text + 9, t & 0xFFFF, 4)

    cdef inline int64_t now_ms(self) except? -1:
        if self._system_clock:
            return _wall_ms()
        return self._clock.now_ms()

    def next_id(self, now_ms=None) -> str:
        """A new id; pass `now_ms` when the caller has just read the clock anyway."""
        cdef int64_t now = self.now_ms() if now_ms is None else now_ms
        cdef char text[ID_LEN]
        self.make_into(now, text)
        return _ascii(text, ID_LEN)


_LIVE_GENERATORS = _weakref.WeakSet()


def _reseed_after_fork():
    for generator in list(_LIVE_GENERATORS):
        generator.reseed()


_os.register_at_fork(after_in_child=_reseed_after_fork)
