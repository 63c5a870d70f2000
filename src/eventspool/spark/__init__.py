"""Events on Spark: a Kafka source on the Python Data Source API, and the pipeline jobs."""
