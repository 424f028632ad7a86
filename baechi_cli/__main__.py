"""`python -m baechi_cli` is the `baechi` command."""

from baechi_cli.cli import main

main(prog_name="baechi")
