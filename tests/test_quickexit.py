"""geryon.quickexit: at exit every live object is frozen (so CPython's exit-time collections skip
it), and every exit handler still runs, in atexit's order, with the process's exit code kept."""

import subprocess
import sys

from launch_support import REPO, clean_env

CHILD = """
import atexit, gc, sys
atexit.register(lambda: print("registered before: frozen", gc.get_freeze_count() > 0, flush=True))
from geryon.quickexit import exit_without_collecting
exit_without_collecting()
handlers = atexit._ncallbacks()
exit_without_collecting()
print("a second call registers", atexit._ncallbacks() - handlers, "more", flush=True)
atexit.register(lambda: print("registered after: frozen", gc.get_freeze_count() > 0, flush=True))
sys.exit(3)
"""


def test_objects_are_frozen_after_the_handlers_registered_later_and_before_the_earlier_ones():
    run = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=clean_env(), capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 3, run.stderr
    assert run.stdout.splitlines() == ["a second call registers 0 more", "registered after: frozen False",
                                       "registered before: frozen True"]
