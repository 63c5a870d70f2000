"""The `spark` extra: the packages eventspool.spark needs beyond eventspool's own, and the
error that names the command installing them.

`pip install eventspool` leaves PySpark, PyArrow and psycopg out: hundreds of MB that an
application which only sends events does not want. The modules of eventspool.spark that
import them turn a missing one into SparkExtraMissingError, so the message says what to
run instead of only which module is absent.
"""

from __future__ import annotations

from importlib.util import find_spec

INSTALL_COMMAND = "pip install 'eventspool[spark]'"
# The extra's packages, by the name each is imported as (pyproject.toml lists them).
MODULES = ("pyspark", "pyarrow", "psycopg")


class SparkExtraMissingError(ImportError):
    """A package of the `spark` extra is not installed."""

    def __init__(self, module: str | None) -> None:
        """`module`: the name a ModuleNotFoundError gives, a submodule's included."""
        package = module.partition(".")[0] if module else " or ".join(MODULES)
        super().__init__(
            f"eventspool.spark needs {package}, which is not installed: {INSTALL_COMMAND}",
            name=package,
        )


def require_spark_extra() -> None:
    """Raise SparkExtraMissingError for the first package of the extra that is absent.

    Looks the packages up without importing them, so a caller that needs only part of
    eventspool.spark does not pay for starting PySpark here.
    """
    for module in MODULES:
        if find_spec(module) is None:
            raise SparkExtraMissingError(module)
