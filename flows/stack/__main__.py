"""`python -m flows.stack CMD`: the old name of `modelmint stack CMD`, the same commands through the same error edge."""

from pipelines.cli import main
from pipelines.cli.stack import stack_app

main(command=stack_app, prog_name="python -m flows.stack")
