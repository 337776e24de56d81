"""`python -m geryon.launch`: see `pydoc geryon.launch`."""

import sys

from geryon.launch.launcher import main

sys.exit(main())
