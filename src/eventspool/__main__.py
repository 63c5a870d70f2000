"""`python -m eventspool` is the `eventspool` command."""

from eventspool.cli import main

main()
