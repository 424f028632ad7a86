"""The one judge of every plan: the event-driven simulator (:mod:`.sim`), :func:`.evaluate.evaluate`
that turns a :class:`.placement.Placement` into a step time, memory peaks and feasibility, and the
lower bounds any plan is compared with (:mod:`.bounds`). Placers propose; only this package
decides. It imports only :mod:`baechi_cli.core`.
"""
