"""The pipeline's jobs: raw archive, per-minute statistics, daily rewards.

They run on PySpark and write to PostgreSQL, so importing any of them without the
`spark` extra fails here, with the command that installs it.
"""

from eventspool.spark.extra import require_spark_extra

require_spark_extra()
