"""A SparkSession for the jobs and tests, with the source registered.

Python workers must run the interpreter of this environment (where eventspool and its
dependencies are installed), so PYSPARK_PYTHON is set to it before the JVM starts.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping

from eventspool.spark.extra import SparkExtraMissingError

try:
    from pyspark.sql import SparkSession
except ModuleNotFoundError as missing:
    raise SparkExtraMissingError(missing.name) from missing

from eventspool.spark.source import register

DEFAULT_MASTER = "local[*]"


class JavaMissingError(RuntimeError):
    """Spark needs a Java runtime and none was found."""


def build_session(
    master: str = DEFAULT_MASTER,
    app_name: str = "eventspool",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or join) a session: UTC everywhere, no web UI, few shuffle partitions.

    `master` may be ``local[N]``, ``local-cluster[workers,cores,memory]`` (executors in
    separate processes) or a cluster URL such as ``spark://host:7077``.
    """
    if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
        raise JavaMissingError(
            "Spark needs Java 17 or newer: install a JRE (e.g. openjdk-17-jre-headless) "
            "or set JAVA_HOME"
        )
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
