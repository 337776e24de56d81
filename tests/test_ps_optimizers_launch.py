"""PS mode trains exactly like the user's optimizer: under `python -m geryon.launch --mode ps --local`
with 2 workers, each case of tests/ps_optimizer_script.py ends with the parameters of one process
trained on the concatenated batch (the tolerance of the other exactness tests), and with the
parameters of --mode allreduce.

Two servers (PS2) where the servers must agree with each other: clipping by the global norm (each
server holds part of the norm), optimizer state saved, loaded and resumed (each server holds the
state of its own slices), and placement (which server holds which slice). One server (PS1)
everywhere else: an elementwise optimizer's update of a slice does not depend on which server holds
the other slices, and the workers' averaging (Lamb, --ps-optimizer worker) is per slice too, so a
second server would add a process to each of those jobs and no check.
"""

import warnings

import pytest
import torch

from geryon.runtime.env import RankEnv
from launch_support import EXIT_ABORT, PYTHON, REPO, exit_abort_reason, launcher_exit_abort, run_launcher
from ps_optimizer_script import build, parse_args, strict_warnings, train_case

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "ps_optimizer_script.py"
PS1 = ["--local", "--mode", "ps", "--workers", "2", "--servers", "1"]
PS2 = ["--local", "--mode", "ps", "--workers", "2", "--servers", "2"]


def _load(path):
    return torch.load(path, weights_only=True)


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=key)


def _one_process(*argv) -> dict:
    """The script's training as one process on the global batch (the default RankEnv), in this one."""
    with warnings.catch_warnings():
        strict_warnings()
        return train_case(parse_args([*map(str, argv), "--out", "-"]), RankEnv())


@pytest.fixture(scope="module")
def single():
    """The final state_dict of one process on the global batch, per case (computed once)."""
    cache = {}

    def result(case: str) -> dict:
        if case not in cache:
            cache[case] = _one_process("--case", case)
        return cache[case]

    return result


def _launch(tmp_path, case: str, *flags, script_args=()) -> tuple[dict, str]:
    """Final parameters and stdout of `case` under the launcher with `flags`; a launch several tests
    need (same case, flags and script arguments) runs once per module."""
    key = (case, tuple(map(str, flags)), tuple(map(str, script_args)))
    if key not in _LAUNCHES:
        out = tmp_path / f"{case}.pt"
        result = run_launcher(*flags, SCRIPT, "--case", case, "--out", out, *script_args, timeout=240)
        aborted = launcher_exit_abort(result)   # worker 0 saved first: the caller checks it, then it is reported
        if not aborted:
            assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
        _LAUNCHES[key] = _load(out), result.stdout, aborted
    params, stdout, aborted = _LAUNCHES[key]
    if aborted:
        _EXIT_ABORTS.append(f"{case} {' '.join(flags)}")
    return params, stdout


_LAUNCHES: dict[tuple, tuple[dict, str, bool]] = {}
_EXIT_ABORTS: list[str] = []   # the launches of the running test that ended on EXIT_ABORT


@pytest.fixture(autouse=True)
def _report_exit_aborts(request):
    """A test whose checks pass after a launch that ended on PyTorch's exit-time abort is reported as
    an xfail naming it (tests/conftest.py turns the pass into it)."""
    _EXIT_ABORTS.clear()
    request.node.exit_aborts = _EXIT_ABORTS
    yield


@pytest.mark.parametrize("case,flags,who", [
    ("sgd_steplr", PS1, "run SGD"),
    ("sgd_onecycle", PS1, "run SGD"),
    ("adamw_groups", PS1, "run AdamW"),
    ("adam_amsgrad", PS1, "run Adam"),
    ("rmsprop", PS1, "run RMSprop"),
    ("lamb", PS1, "every worker runs Lamb"),
    ("clip", PS2, "run SGD"),
    ("torch_clip", [*PS1, "--ps-optimizer", "worker"], "every worker runs SGD"),
    ("checkpoint", PS2, "run Adam"),
    ("checkpoint", [*PS1, "--ps-optimizer", "worker"], "every worker runs Adam"),
    ("adam_unused", PS1, "run Adam"),
    ("late_lr", PS1, "run SGD"),
], ids=["sgd-steplr", "sgd-onecycle", "adamw-2groups-warmup-cosine", "adam-amsgrad", "rmsprop",
        "lamb-workers-step", "clip-servers", "torch-clip-workers", "checkpoint-servers",
        "checkpoint-workers", "adam-unused-tensors", "lr-set-between-backward-and-step"])
def test_ps_equals_one_process(tmp_path, single, case, flags, who):
    params, stdout = _launch(tmp_path, case, *flags)
    assert who in stdout
    _assert_same(params, single(case))


def test_ps_equals_allreduce(tmp_path):
    """The same script, BatchNorm buffers included (DDP's convention: worker 0's, every step; one
    process has no such convention to compare with)."""
    ps, _ = _launch(tmp_path, "bn", *PS2)
    allreduce, _ = _launch(tmp_path, "bn", "--local", "--mode", "allreduce", "--workers", "2")
    _assert_same(ps, allreduce)


AHEAD = ["--ps-pull", "ahead"]


@pytest.mark.parametrize("case,flags", [
    ("adamw_groups", [*PS1, *AHEAD]), ("checkpoint", [*PS2, *AHEAD]), ("checkpointed", [*PS1, *AHEAD]),
    ("lamb", PS1), ("torch_clip", [*PS1, "--ps-optimizer", "worker", *AHEAD]),
], ids=["adamw-2groups-warmup-cosine", "checkpoint", "activation-checkpointing", "lamb-workers-auto",
        "torch-clip-workers"])
def test_pull_ahead_equals_one_process(tmp_path, single, case, flags):
    """--ps-pull ahead (the servers stepping) and auto (the workers stepping: ahead) train alike."""
    params, _ = _launch(tmp_path, case, *flags)
    _assert_same(params, single(case))


@pytest.mark.parametrize("case", ["adam_unused", "bn"])
def test_pull_ahead_is_bit_equal_to_pull_end(tmp_path, single, case):
    """The same updates in the same order, only earlier: with tensors no worker (ABSENT frames on
    both) or one worker has a gradient for, Adam with weight decay skipping them as torch does; and
    with BatchNorm buffers broadcast before every forward (two servers: the launches the placement
    test and the allreduce comparison read)."""
    ps = PS2 if case == "bn" else PS1
    (tmp_path / "end").mkdir()
    ahead, _ = _launch(tmp_path, case, *ps, *AHEAD)
    end, _ = _launch(tmp_path / "end", case, *ps)   # the servers step: pulling at the end is the default
    assert ahead.keys() == end.keys()
    for key in end:
        assert torch.equal(ahead[key], end[key]), key
    if case == "bn":
        return
    _assert_same(ahead, single(case))
    untouched = build("adam_unused").never.weight.detach()   # no gradient ever: not even weight decay
    assert torch.equal(ahead["never.weight"], untouched)


@pytest.mark.parametrize("case, message", [
    ("late_lr", "changed between backward and optimizer.step()"),
    ("clip", "clip_grad_norm_ with --ps-pull ahead"),
    ("peek", "between backward and optimizer.step() with --ps-pull ahead"),
], ids=["settings-changed-after-backward", "clipping-by-global-norm", "forward-after-backward"])
def test_pull_ahead_refuses_what_it_cannot_do_exactly(tmp_path, case, message):
    """Settings sent when backward begins must hold at step(); global-norm clipping needs every
    gradient before any update; a forward pass after backward would see half-replaced parameters:
    each stops the job with what to do instead."""
    result = run_launcher(*PS1, *AHEAD, SCRIPT, "--case", case, "--out", tmp_path / "x.pt", timeout=240)
    assert result.returncode != 0
    assert message in result.stderr and "--ps-pull end" in result.stderr


def test_torch_clipping_with_servers_stepping_is_refused(tmp_path):
    """torch.nn.utils.clip_grad_norm_ after the gradients left would be lost: stop, say what to do."""
    result = run_launcher(*PS1, SCRIPT, "--case", "torch_clip", "--out", tmp_path / "x.pt", timeout=240)
    assert result.returncode != 0
    assert "optimizer.clip_grad_norm_(max_norm)" in result.stderr and "--ps-optimizer worker" in result.stderr


def test_ps_mode_without_servers_clips_the_averaged_gradient(single):
    """Under Slurm's variables alone (no launcher, no servers) ps mode averages with gloo when backward
    ends, so torch's own clip_grad_norm_ sees the averaged gradient."""
    import subprocess
    import tempfile

    from launch_support import clean_env

    from ports import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        out = f"{folder}/torch_clip.pt"
        processes = [subprocess.Popen(
            [PYTHON, str(SCRIPT), "--case", "torch_clip", "--out", out], cwd=REPO, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=clean_env(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank), GERYON_MODE="ps",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo"))
            for rank in range(2)]
        outputs = []
        try:
            for process in processes:
                outputs.append(process.communicate(timeout=120))
        finally:
            for process in processes:
                process.kill()
                process.wait()
        codes = [p.returncode for p in processes]
        aborted = [rank for rank, code in enumerate(codes) if code != 0]
        # PyTorch's gloo can abort a rank at interpreter exit, after its work (EXIT_ABORT): check the
        # results, then report it; any other failure fails here
        assert all(codes[rank] == -6 and EXIT_ABORT in outputs[rank][1] for rank in aborted), \
            f"exit codes {codes}\n" + outputs[0][1][-2000:] + outputs[1][1][-2000:]
        _assert_same(_load(out), single("torch_clip"))
    if aborted:
        pytest.xfail(exit_abort_reason(f"rank(s) {aborted}"))


@pytest.mark.parametrize("flags", [PS2, [*PS1, "--ps-optimizer", "worker"]], ids=["servers", "workers"])
def test_resume_from_a_checkpoint_of_one_process(tmp_path, single, flags):
    """A checkpoint one process wrote after 3 steps, loaded before the first forward, trains on alike
    (with the servers stepping, each of two servers takes the optimizer state of its own slices)."""
    checkpoint = tmp_path / "three.ckpt"
    _one_process("--case", "adam_amsgrad", "--save-at", "3", "--checkpoint", checkpoint)
    assert "exp_avg" in str(torch.load(checkpoint, weights_only=True)["optimizer"]["state"][0].keys())
    params, _ = _launch(tmp_path, "adam_amsgrad", *flags,
                        script_args=("--resume", "--checkpoint", checkpoint))
    _assert_same(params, single("adam_amsgrad"))


@pytest.mark.parametrize("flags", [[], ["--ps-optimizer", "worker"]], ids=["servers", "workers"])
def test_placement_moves_slices_not_results(tmp_path, flags):
    """--ps-placement count (round-robin) and bytes (the default) put the slices on different servers
    and train bit-equally; worker 0 says how the bytes were spread."""
    (tmp_path / "count").mkdir()
    balanced, out = _launch(tmp_path, "bn", *PS2, *flags)
    dealt, out_count = _launch(tmp_path / "count", "bn", *PS2, *flags, "--ps-placement", "count")
    assert "servers by bytes" in out and "servers by count" in out_count
    assert balanced.keys() == dealt.keys()
    for key in dealt:
        assert torch.equal(balanced[key], dealt[key]), key
