"""The worker processes' side: loops that run handlers, so a slow or CPU-bound handler
never holds the poll thread (or the GIL it needs to keep the group membership alive).

Parts (key-ordered events) run in arrival order, which is each key's offset order, and
the worker keeps that order itself across retries: a failed event waits for its backoff
in the worker and holds back its key's later events meanwhile; one out of attempts is
reported for the poll thread to dead-letter. A plain worker's outcomes go back in one
report at most every 5 ms while it is busy (for slow events, about every hundred events,
at most 20 ms apart), an async worker's every 2 ms; a whole part is one entry once it is
done. A revoked partition's events still queued are dropped on request.

Tasks (everything else): a plain function's worker runs one task at a time, in order.
Before each event it writes the event's index into shared memory, so when a worker dies
the pool knows which event killed it, which ones finished and which never started.

An `async def` handler: each worker runs an event loop with up to `concurrency` handler
calls at once, takes new transfers while earlier ones run, and reports each event as it
finishes (the reports of a couple of milliseconds in one message), so a slow event holds
back neither the others nor the commit of those before it. Events of one scope (key or
partition, by the ordering) still run one after the other, in order.
"""
