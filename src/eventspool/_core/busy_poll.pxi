# Busy polling: a wait for a socket that tries again for a few microseconds before it
# blocks. Included by native.pyx; the agent's listener and a blocking caller's lone call
# use it.
#
# On a VM whose idle vCPU halts (no guest halt polling), every wake-up of a thread that
# blocked costs the host's wake-up of that vCPU: 16 us at p50 for the agent's listener
# (`perf sched timehist`), twice per round trip, where the echo server the bench
# compares with shared its caller's vCPU in that profile and never halted it. A thread that keeps
# trying for the next few microseconds meets the answer or the next request itself.
# Each try yields the CPU to whatever else is runnable there, so a spin takes no time
# from callers on a loaded machine; and a spin that meets nothing backs the next ones
# off, so a quiet connection costs nothing. A wait's timeout counts from when it blocks:
# it may end up to one budget later.

cdef extern from "<sched.h>" nogil:
    int sched_yield()


cdef enum:
    BUSY_POLL_MOST_SKIPPED = 64  # waits that block at once after misses in a row, at most


cdef struct BusyPoll:
    double budget_s  # how long a wait keeps trying before it blocks; 0: it never does
    uint32_t skip  # waits left that block at once
    uint32_t backoff  # what the last miss set `skip` to


cdef inline double _busy_poll_start(BusyPoll *poll) noexcept nogil:
    """When this wait stops trying and blocks; 0 when it blocks at once."""
    if poll.budget_s <= 0:
        return 0
    if poll.skip:
        poll.skip -= 1
        return 0
    return _monotonic_s() + poll.budget_s


cdef inline void _busy_poll_met(BusyPoll *poll) noexcept nogil:
    """A try found what it waited for: the next wait spins as well."""
    poll.backoff = 0


cdef inline bint _busy_poll_again(BusyPoll *poll, double until) noexcept nogil:
    """After a try that found nothing: whether to try once more (having yielded the
    CPU). A spin that ran out is a miss: the next 1, 2, 4 ... 64 waits block at once."""
    if _monotonic_s() < until:
        sched_yield()
        return True
    poll.backoff = 1 if poll.backoff == 0 else min(2 * poll.backoff, BUSY_POLL_MOST_SKIPPED)
    poll.skip = poll.backoff
    return False


cdef inline void _busy_poll_set(BusyPoll *poll, double budget_s) noexcept nogil:
    """A new budget (the Python side checked it), with no backoff."""
    poll.budget_s = budget_s
    poll.skip = 0
    poll.backoff = 0
