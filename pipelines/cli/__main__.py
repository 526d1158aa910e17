"""`python -m pipelines.cli`: the same entry point as the `modelmint` console script."""

from pipelines.cli import main

main()
