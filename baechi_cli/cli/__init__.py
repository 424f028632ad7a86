"""The command line: click commands that parse and validate options, call :mod:`baechi_cli.app`
and map errors to exit codes (:mod:`.commands`), and the rich rendering of what they return
(:mod:`.render`). The only layer that prints.
"""
