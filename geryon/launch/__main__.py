"""`python -m geryon.launch`: see `pydoc geryon.launch`."""

import sys

from geryon.launch.launcher import main
from geryon.quickexit import exit_without_collecting

exit_without_collecting()   # the launcher imports torch for the job's store: its exit need not collect it
sys.exit(main())
