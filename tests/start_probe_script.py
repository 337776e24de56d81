"""What a rank sees of its own process, as JSON on stdout: run by tests/test_launch_template.py under
`--start fork` and `--start exec`, which must agree.

`--exit CODE` ends with sys.exit(CODE); `--raise` with an uncaught exception; `--interrupt` with an
uncaught KeyboardInterrupt; `--wait` prints "ready" and sleeps (for the test that kills the launcher).
At exit a non-daemon thread, an atexit handler and a file left open write to --out-dir.
"""

import argparse
import atexit
import json
import os
import pickle
import random
import sys
import threading
import time
import warnings

import numpy
import torch


class Local:
    """Pickled by reference to __main__, as classes of a script are."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--exit", type=int)
    parser.add_argument("--raise", dest="raise_", action="store_true")
    parser.add_argument("--interrupt", action="store_true")
    parser.add_argument("--wait", action="store_true")
    args = parser.parse_args()
    rank = os.environ["RANK"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("deprecated in __main__", DeprecationWarning)   # shown by default in __main__ only
    print(json.dumps({
        "argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
        "main_is_this": sys.modules["__main__"].__dict__ is globals(),
        "rank": rank, "world": os.environ["WORLD_SIZE"], "pickled": len(pickle.dumps(Local())) > 0,
        "random": random.random(), "numpy": float(numpy.random.rand()), "threads": torch.get_num_threads(),
        "main_warning_shown": len(caught), "session_leader": os.getsid(0) == os.getpid(),
        "stdout_line_buffered": sys.stdout.write_through or sys.stdout.line_buffering,
        "comm": open("/proc/self/comm").read().strip(),
    }), flush=True)
    left_open = open(os.path.join(args.out_dir, f"left-open-{rank}.txt"), "w")
    left_open.write("written, never flushed nor closed")
    globals()["left_open"] = left_open
    atexit.register(lambda: open(os.path.join(args.out_dir, f"atexit-{rank}.txt"), "w").close())
    threading.Thread(target=lambda: (time.sleep(0.3),
                                     open(os.path.join(args.out_dir, f"thread-{rank}.txt"), "w").close())).start()
    if args.wait:
        print("ready", flush=True)
        time.sleep(600)
    if args.raise_:
        raise RuntimeError(f"rank {rank} raised")
    if args.interrupt:
        raise KeyboardInterrupt
    if args.exit is not None:
        sys.exit(args.exit)


if __name__ == "__main__":
    main()
