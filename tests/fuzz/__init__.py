"""A fuzz harness for every input reader of baechi, and for the CLI end to end.

Modules (import them as ``fuzz.<module>`` with ``tests/`` on the path, as pytest and ``make fuzz`` do):

* :mod:`fuzz.mutators` -- byte-level and structure-aware (protobuf, JSON, YAML) mutations;
* :mod:`fuzz.targets` -- the readers, their seeds from ``testdata/`` and format-specific mutations;
* :mod:`fuzz.oracle` -- reproducible cases and the oracle: a result or a one-line
  BaechiError, within a time and a memory bound;
* :mod:`fuzz.cli_slice` -- mutated files through ``baechi place`` / ``profile`` / ``verify``;
* :mod:`fuzz.minimise` -- shrinks a failing input for the regression corpus;
* ``python -m fuzz`` (:mod:`fuzz.__main__`) -- ``make fuzz``: many cases in worker processes.

``tests/test_fuzz_readers.py`` runs a few thousand fixed cases in the default
suite; ``tests/test_fuzz_corpus.py`` replays ``tests/fuzz_corpus/``, the inputs
that made a reader fail before its fix. bench/fuzz.md records a full run.
"""
