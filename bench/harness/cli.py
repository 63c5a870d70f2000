"""The command line every bench script shares: `--quick`, `--repeats`, `--dir`, `--keep`.

``--quick`` runs a reduced version in well under a minute; progress and a table go to
stderr; the last line on stdout is one JSON object (`harness.output.emit_result`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.output import emit_result, print_figures

REPEATS = {True: 3, False: 5}  # by --quick


@dataclass(frozen=True, slots=True)
class BenchArgs:
    """The options every bench script understands, plus the script's own in `namespace`."""

    quick: bool
    repeats: int
    scratch_parent: Path | None
    keep: bool
    namespace: argparse.Namespace


def parse_args(
    description: str,
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> BenchArgs:
    """The common options, and those `extra` adds (their values in `namespace`)."""
    parser = argparse.ArgumentParser(description=description)
    add = parser.add_argument
    add("--quick", action="store_true", help="reduced run (under a minute), shorter passes")
    default = f"{REPEATS[True]} with --quick, else {REPEATS[False]}"
    add("--repeats", type=int, help=f"repetitions, each figure their median (default {default})")
    add("--dir", type=Path, help="parent directory for scratch files (default: the system's)")
    add("--keep", action="store_true", help="keep the scratch directory, do not delete it")
    if extra is not None:
        extra(parser)
    ns = parser.parse_args(argv)
    repeats = REPEATS[ns.quick] if ns.repeats is None else ns.repeats
    if repeats < 1:
        parser.error("--repeats must be at least 1")
    return BenchArgs(bool(ns.quick), repeats, ns.dir, bool(ns.keep), ns)


def bench_main(
    description: str,
    run: Callable[[BenchArgs], dict[str, object]],
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """A bench script's whole life: parse its options, `run` it, print the table of its
    figures on stderr and its result as the last line on stdout."""
    result = run(parse_args(description, argv, extra))
    print_figures(result)
    emit_result(result)
    return 0
