"""Finding the best plan: a placement problem and its candidates (:mod:`.candidates`: run a placer,
expand its placement, have the evaluator judge it), ``--algo auto``'s search over placers and pass
settings within a budget counted by a cost model (:mod:`.auto`), local refinement of the best plans
(:mod:`.refine`) and the exact CP-SAT stage's driver.
"""
