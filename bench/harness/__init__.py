"""The one harness every bench script stands on: nothing here is a benchmark."""
