"""The job's TLS credentials under `--tls`: made fresh per job, handed to the ranks, removed at the end.

`job_credentials(config)` generates a key and a self-signed certificate (geryon.transport.tls), writes
them to a 0600 file inside a fresh 0700 directory (mkdtemp; the file created with O_EXCL|O_NOFOLLOW by
geryon.safefiles) and yields the config with `tls_file` set: local and emulated ranks read that file
(GERYON_TLS_FILE; namespaces share the file system). The SSH backend reads it and sends it on the rank's
stdin instead (geryon.launch.ssh_run). The directory is removed when the job ends, whatever the ending.
"""

import contextlib
import dataclasses
import os
import shutil
import tempfile

from geryon.launch.config import LaunchConfig
from geryon.safefiles import create_exclusive

CREDENTIALS_NAME = "job-tls.pem"


@contextlib.contextmanager
def job_credentials(config: LaunchConfig):
    """Yield `config`, with a fresh credentials file in `tls_file` when `config.tls` (else unchanged)."""
    if not config.tls:
        yield config
        return
    from geryon.transport.tls import generate_credentials

    credentials = generate_credentials(config.job_id)
    directory = tempfile.mkdtemp(prefix=f"geryon-{config.job_id}-")   # 0700
    try:
        path = os.path.join(directory, CREDENTIALS_NAME)
        if not create_exclusive(path, credentials.pem, mode=0o600):
            raise FileExistsError(path)     # cannot happen in a fresh mkdtemp directory
        yield dataclasses.replace(config, tls_file=path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
