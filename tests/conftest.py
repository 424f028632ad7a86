"""Test-session set-up.

OR-Tools' HiGHS backend crashes (SIGSEGV) in a process that imported
TensorFlow before OR-Tools; the other order works. Some tests import
TensorFlow in-process, so OR-Tools is imported first, here, before any test
module. (`baechi place` itself never imports TensorFlow.)
"""

import ortools.linear_solver.pywraplp  # noqa: F401  (import order matters, see above)
