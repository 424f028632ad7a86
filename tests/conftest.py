"""Test-session set-up.

OR-Tools' HiGHS backend crashes (SIGSEGV) in a process that imported
TensorFlow before OR-Tools; the other order works. Some tests import
TensorFlow in-process, so OR-Tools is imported first, here, before any test
module. (`baechi place` itself never imports TensorFlow.)

Property tests (Hypothesis) draw the same examples on every run, seeded by
each test's name (profile ``repro``), so the suite passes or fails alike on
every machine and in every CI run. ``HYPOTHESIS_PROFILE=explore make test``
draws new examples each run, to look for failures; ``make fuzz`` does the
same for the readers at scale. The traced-step cache is off.
"""

import os

import ortools.linear_solver.pywraplp  # noqa: F401  (import order matters, see above)

# Every test traces what it reads (baechi_cli.io.pt2_cache is off; its own tests turn it on), and
# nothing is written under the user's ~/.cache.
os.environ["BAECHI_CACHE_DIR"] = ""
from hypothesis import settings

settings.register_profile("repro", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repro"))
