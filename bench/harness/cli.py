"""The command line every bench script shares: `--quick`, `--repeats`, `--dir`, `--keep`.

Every bench script follows the same contract: ``--quick`` runs a reduced version that
finishes in well under a minute; progress lines and a table go to stderr; the LAST line
on stdout is exactly one JSON object (see `harness.output.emit_result`).
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.output import emit_result, print_figures

QUICK_REPEATS = 3
FULL_REPEATS = 5


@dataclass(frozen=True, slots=True)
class BenchArgs:
    """The options every bench script understands, plus the script's own in `namespace`."""

    quick: bool
    repeats: int
    scratch_parent: Path | None
    keep: bool
    namespace: argparse.Namespace

    def make_scratch(self, prefix: str) -> Path:
        """A new scratch directory under `--dir` (created if missing) or the system's."""
        if self.scratch_parent is not None:
            self.scratch_parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.scratch_parent))


def parse_args(
    description: str,
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> BenchArgs:
    """Parse the common options (`--quick`, `--repeats`, `--dir`, `--keep`) and any extras.

    `extra` may add script-specific options; their values are in `BenchArgs.namespace`.
    """
    parser = argparse.ArgumentParser(description=description)
    add = parser.add_argument
    add("--quick", action="store_true", help="reduced run (under a minute), shorter passes")
    default = f"{QUICK_REPEATS} with --quick, else {FULL_REPEATS}"
    add("--repeats", type=int, help=f"repetitions, each figure their median (default {default})")
    add("--dir", type=Path, help="parent directory for scratch files (default: the system's)")
    add("--keep", action="store_true", help="keep the scratch directory, do not delete it")
    if extra is not None:
        extra(parser)
    ns = parser.parse_args(argv)
    repeats = (
        ns.repeats if ns.repeats is not None else (QUICK_REPEATS if ns.quick else FULL_REPEATS)
    )
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
