"""``python -m benchmarks.debezium`` from the repository root: the side-by-side benchmark."""

from benchmarks.debezium.run import main

main()
