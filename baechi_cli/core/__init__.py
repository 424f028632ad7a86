"""The core IR, below everything else: the op graph (:mod:`.graph`), device specs and the
communication model (:mod:`.devices`), one-line errors with their exit codes (:mod:`.errors`), and
small shared utilities (union-find, pausing the cyclic garbage collector). It imports nothing else
from baechi.
"""
