"""The compiled core of eventspool: see native.pyx."""
