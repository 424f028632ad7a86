"""`python -m baechi_cli` is the `baechi` command."""

from baechi_cli.cli.commands import main

main(prog_name="baechi")
