"""Graph passes, each a function of an :class:`~baechi_cli.core.graph.OpGraph` to a new one:
colocation and control flow (what the input imposes), forward-only placement, co-placement, fusion,
and the training pass that synthesizes a backward and an optimizer. :mod:`.manager` holds the pass
registry, runs the passes in their declared order and records what each did.
"""
