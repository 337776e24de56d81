"""The example CNN: it learns alone, and gives the same loss curve under plain torchrun."""

import subprocess

import pytest

from launch_support import EXAMPLE, EXAMPLE_ARGS, REPO, json_records, launcher_exit_abort, loss_curve, \
    only_exit_abort, run_plain_torchrun, run_single_process


def test_dataset_is_deterministic_and_balanced():
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_cnn", EXAMPLE)
    train_cnn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_cnn)
    images, labels = train_cnn.make_dataset(500, seed=3)
    again, labels_again = train_cnn.make_dataset(500, seed=3)
    assert images.shape == (500, 3, 32, 32)
    assert (images == again).all() and (labels == labels_again).all()
    assert labels.bincount(minlength=10).min() > 20


@pytest.mark.slow
def test_loss_falls_and_accuracy_is_reported():
    records = run_single_process("--iterations", "120", "--width", "8", "--train-size", "2048",
                                 "--test-size", "500", "--log-json")
    losses = loss_curve(records)
    final = records[-1]
    assert final["final"] and len(losses) == 120
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10
    assert final["accuracy"] > 0.3  # chance is 0.1


@pytest.mark.slow
def test_torchrun_gives_the_single_process_curve(single_curve):
    result, exit_abort = run_plain_torchrun(EXAMPLE, EXAMPLE_ARGS, workers=2, timeout=180)
    records = json_records(result.stdout.splitlines())
    assert loss_curve(records) == pytest.approx(single_curve, rel=1e-4, abs=1e-5)  # every iteration, exact
    if exit_abort:
        pytest.xfail(exit_abort)
    assert records[-1]["workers"] == 2


def test_only_pytorchs_exit_abort_is_excused():
    """torchrun's report of the one CI failure (rank 1 aborted at exit, rank 0 then stopped) is told apart
    from a rank that failed, and from an abort with another message."""
    report = (REPO / "tests" / "data" / "torchrun-exit-abort.txt").read_text()
    assert only_exit_abort(report)
    assert not only_exit_abort(report.replace("exitcode  : -15", "exitcode  : 1"))
    assert not only_exit_abort(report.replace("terminate called without an active exception",
                                              "Segmentation fault"))


def test_only_pytorchs_exit_abort_is_excused_under_the_launcher():
    """geryon.launch's report of the same abort (seen in tests/test_ps_optimizers_launch.py, allreduce mode,
    worker 1 after worker 0 had saved) is told apart from another signal and another message."""
    report = (REPO / "tests" / "data" / "launcher-exit-abort.txt").read_text()

    def excused(code, stderr):
        return launcher_exit_abort(subprocess.CompletedProcess([], code, "", stderr))

    assert excused(134, report)
    assert not excused(139, report.replace("SIGABRT", "SIGSEGV"))
    assert not excused(134, report.replace("terminate called without an active exception", "double free"))
    assert not excused(1, report)


def _example_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_cnn", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, workers, sizes", [
    ([], 3, (64, 192)),                                     # torchrun's convention: per process
    (["--batch-size", "16"], 3, (16, 48)),
    (["--global-batch-size", "96"], 3, (32, 96)),           # the global batch, split over the workers
    (["--global-batch-size", "64"], 1, (64, 64)),
])
def test_batch_size_is_per_process_unless_global_is_asked(argv, workers, sizes):
    train_cnn = _example_module()
    assert train_cnn.batch_sizes(train_cnn.parse_args(argv), workers) == sizes


def test_a_global_batch_that_does_not_split_says_what_to_do():
    train_cnn = _example_module()
    with pytest.raises(SystemExit, match="--global-batch-size 64 must be a multiple of the 3 workers .* "
                                         "or give the per-process size with --batch-size"):
        train_cnn.batch_sizes(train_cnn.parse_args(["--global-batch-size", "64"]), 3)
    with pytest.raises(SystemExit):  # argparse: one or the other
        train_cnn.parse_args(["--batch-size", "8", "--global-batch-size", "16"])
