"""Train a small CNN on a synthetic 10-class image set; the same script alone, under geryon, or torchrun.

    python examples/train_cnn.py                                   # one process
    python -m geryon.launch --workers 4 examples/train_cnn.py      # geryon (allreduce)
    python -m geryon.launch --mode ps --workers 4 --servers 2 examples/train_cnn.py
    torchrun --nproc-per-node 2 examples/train_cnn.py              # plain torchrun (gloo: no job secret)
    GERYON_JOB_SECRET=$(openssl rand -hex 16) GERYON_MODE=ps GERYON_SERVERS=1 \
        torchrun --nproc-per-node 3 examples/train_cnn.py          # torchrun: geryon's flows, 1 server + 2 workers
    python -m geryon.launch --nproc-per-node 2 examples/train_cnn.py  # torchrun's flag works too

The script ships inside the package (geryon/examples/train_cnn.py, which `geryon demo` runs from any
directory); this file runs that one, so both stay the same. See its docstring for the data set, and
docs/engines.md for Slurm and Kubernetes.
"""

from geryon.examples.train_cnn import *  # noqa: F401,F403 -- make_dataset, main, ... for importers
from geryon.examples.train_cnn import main

if __name__ == "__main__":
    main()
