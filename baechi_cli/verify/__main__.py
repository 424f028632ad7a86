"""``python -m baechi_cli.verify``: the run check's subprocess (:func:`baechi_cli.verify.run.main`)."""

import sys

from baechi_cli.verify.run import main

sys.exit(main())
