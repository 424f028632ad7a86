"""A PyTorch runtime for baechi's plans: the exported program cut into stages that train.

:mod:`~baechi_cli.runtime.cut` cuts a ``torch.export`` program where a plan says,
:mod:`~baechi_cli.runtime.plan` reads which stage each node is in from a report,
:mod:`~baechi_cli.runtime.stages` builds torch's ``PipelineStage`` objects and schedule,
:mod:`~baechi_cli.runtime.makespan` runs a makespan plan op for op, and
:mod:`~baechi_cli.runtime.launch` runs them on gloo ranks beside one process (``baechi verify
--torch``). torch is imported inside these modules only; ``baechi place`` never imports them.
"""
