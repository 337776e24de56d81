"""The job files for Slurm and Kubernetes (cluster/engines/) parse, and set what docs/engines.md says."""

import subprocess

import pytest

from geryon import envvars
from geryon.runtime.env import RankEnv
from launch_support import REPO

ENGINES = REPO / "cluster" / "engines"


def containers(manifest: dict) -> list[tuple[dict, dict]]:
    """(pod spec, container) of every container of a PyTorchJob or JobSet manifest."""
    if manifest["kind"] == "PyTorchJob":
        specs = [r["template"]["spec"] for r in manifest["spec"]["pytorchReplicaSpecs"].values()]
    else:
        specs = [j["template"]["spec"]["template"]["spec"] for j in manifest["spec"]["replicatedJobs"]]
    return [(spec, c) for spec in specs for c in spec["containers"]]


@pytest.mark.parametrize("name, kind", [("pytorchjob.yaml", "PyTorchJob"), ("jobset.yaml", "JobSet")])
def test_kubernetes_manifests_mount_the_secret_and_name_a_valid_job(name, kind, tmp_path):
    import yaml   # PyYAML comes with the test extras, not with geryon
    text = (ENGINES / name).read_text()
    manifest = yaml.safe_load(text)
    assert manifest["kind"] == kind and "geryon cluster up" in text
    for pod, container in containers(manifest):
        env = {e["name"]: e["value"] for e in container["env"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert env[envvars.JOB_SECRET_FILE].startswith(mounts[next(iter(secrets))] + "/")
        assert envvars.JOB_SECRET not in env          # never the secret itself in the manifest
        secret = tmp_path / "secret"
        secret.write_text("s")
        # the settings make a valid rank: the first of 2 nodes x 5 processes is a server
        rank = RankEnv.from_environ({**env, envvars.JOB_SECRET_FILE: str(secret), "RANK": "0",
                                     "WORLD_SIZE": "10", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "5",
                                     "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2"})
        assert (rank.role, rank.workers, rank.servers) == ("server", 8, 2)


def test_slurm_script_is_valid_bash_and_runs_torchrun_with_c10d():
    script = ENGINES / "slurm.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "srun" in text and "--rdzv-backend c10d" in text and "geryon cluster up" in text
    assert envvars.JOB_SECRET_FILE in text
