"""Train a small CNN on a synthetic 10-class image set; the same script alone, under geryon, or torchrun.

    python examples/train_cnn.py                                   # one process
    python -m geryon.launch --workers 4 examples/train_cnn.py      # geryon (allreduce)
    python -m geryon.launch --mode ps --workers 4 --servers 2 examples/train_cnn.py
    torchrun --nproc-per-node 2 examples/train_cnn.py              # plain torchrun
    python -m geryon.launch --nproc-per-node 2 examples/train_cnn.py  # torchrun's flag works too
    python -m geryon.launch --local --nproc-per-node 2 examples/train_cnn.py --device cuda   # on GPUs
    python -m geryon.launch --local --mode ps --server-device cuda examples/train_cnn.py --device cuda

The data set is generated, not downloaded: each class is a smooth random 3x32x32 pattern (from a
fixed seed), and every image is its class pattern, randomly shifted, plus Gaussian noise; so it is
learnable but not trivial. As under torchrun, `--batch-size` is PER PROCESS: W workers train on a
global batch of W x batch-size images. `--global-batch-size G` gives the global batch instead (each
worker takes G/W), so that W workers follow the same loss curve as one process with the same G.
The printed loss is the mean over workers (the global batch's loss), except under --sync partial,
where it is rank 0's own (averaging it would make every worker wait for the slowest at every
iteration, the very wait partial allreduce removes). `--log-json` prints one JSON
object per iteration for machines ({"iteration", "loss", "time_s"}) and one at the end
({"final": true, "accuracy", "images_per_s", ...}). `--device auto` (the default) trains on the
rank's GPU when the process sees one (geryon.init() picks it by LOCAL_RANK), else on the CPU.
Iteration i always trains on the i-th global batch, so a job that resumes from a server checkpoint
(`--mode ps --max-restarts N --ps-checkpoint-every K --ps-checkpoint-dir DIR`) skips the batches of
the `ctx.resumed_step` iterations already done and sees the batches of an uninterrupted run.
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn

import geryon
from geryon.errors import ConfigError
from geryon.runtime.device import DEVICE_CHOICES, select_device

CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)


def make_dataset(count: int, seed: int, noise: float = 6.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` images and labels; the class patterns depend only on the fixed pattern seed."""
    patterns_rng = torch.Generator().manual_seed(1234)
    coarse = torch.randn(CLASSES, 3, 4, 4, generator=patterns_rng)
    patterns = F.interpolate(coarse, size=(40, 40), mode="bilinear", align_corners=False)
    rng = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (count,), generator=rng)
    shifts = torch.randint(0, 9, (count, 2), generator=rng)
    images = torch.empty(count, *IMAGE_SHAPE)
    for i in range(count):
        dy, dx = shifts[i].tolist()
        images[i] = patterns[labels[i], :, dy:dy + 32, dx:dx + 32]
    images += noise * torch.randn(images.shape, generator=rng)
    return images, labels


class SmallCNN(nn.Module):
    """Three conv blocks and two linear layers; `width` scales the channels (tests use tiny ones).

    `hidden` is the width of the first linear layer (default 4 x width); a large one makes the model
    communication-heavy (`geryon demo` uses 4096: a 8 MB layer behind 60 KB of convolutions).
    """

    def __init__(self, width: int = 16, hidden: int | None = None):
        super().__init__()
        hidden = hidden or 4 * width
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * 16, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))

    def forward(self, x):
        return self.classifier(self.features(x))


def global_batches(count: int, batch_size: int, seed: int):
    """Index tensors of the global batches, epoch after epoch, the same on every rank."""
    rng = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(count, generator=rng)
        for start in range(0, count - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def accuracy(model, images, labels) -> float:
    model.eval()
    with torch.no_grad():
        correct = sum((model(images[i:i + 500]).argmax(1) == labels[i:i + 500]).sum().item()
                      for i in range(0, len(images), 500))
    model.train()
    return correct / len(images)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=150)
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--batch-size", type=int, default=None,
                       help="images per process per iteration, as under torchrun (default 64)")
    sizes.add_argument("--global-batch-size", type=int, default=None, metavar="G",
                       help="images per iteration over all workers (each takes G / workers)")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--width", type=int, default=16, help="channels of the first conv layer")
    parser.add_argument("--hidden", type=int, default=None,
                        help="units of the hidden linear layer (default 4 x width)")
    parser.add_argument("--train-size", type=int, default=4096)
    parser.add_argument("--test-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--log-json", action="store_true", help="print one JSON line per iteration")
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                        help="where the model trains: auto (the rank's GPU when there is one), cpu, cuda")
    return parser.parse_args(argv)


def batch_sizes(args, workers: int) -> tuple[int, int]:
    """(per-process batch, global batch) from --batch-size or --global-batch-size."""
    if args.global_batch_size is None:
        local = 64 if args.batch_size is None else args.batch_size
        if local < 1:
            raise SystemExit(f"--batch-size {local} must be at least 1")
        return local, local * workers
    if args.global_batch_size < workers or args.global_batch_size % workers:
        raise SystemExit(f"--global-batch-size {args.global_batch_size} must be a multiple of the {workers} "
                         f"workers (each trains on global/{workers} images); pick a multiple of {workers}, "
                         f"or give the per-process size with --batch-size, as under torchrun")
    return args.global_batch_size // workers, args.global_batch_size


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    job = geryon.init()
    try:
        device = select_device(args.device, job.local_rank)
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    local, global_batch = batch_sizes(args, job.world_size)
    mine = slice(job.rank * local, (job.rank + 1) * local)

    images, labels = make_dataset(args.train_size, seed=args.seed)
    test_images, test_labels = make_dataset(args.test_size, seed=args.seed + 1)
    images, labels, test_images, test_labels = (t.to(device) for t in (images, labels, test_images, test_labels))
    torch.manual_seed(args.seed)
    model = SmallCNN(args.width, args.hidden).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    model, optimizer = geryon.distribute(model, optimizer)

    partial = job.sync != "full"
    batches = global_batches(args.train_size, global_batch, seed=args.seed)
    for _ in range(job.resumed_step):   # resumed from a server checkpoint: these batches are trained
        next(batches)
    started = time.perf_counter()
    global_loss = float("nan")
    done = max(0, args.iterations - job.resumed_step)
    for iteration in range(job.resumed_step, args.iterations):
        index = next(batches)[mine].to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images[index]), labels[index])
        loss.backward()
        optimizer.step()
        global_loss = loss.item() if partial else geryon.average(loss.item())
        if job.is_main:
            if args.log_json:
                print(json.dumps({"iteration": iteration, "loss": global_loss,
                                  "time_s": round(time.perf_counter() - started, 4)}), flush=True)
            elif iteration % args.log_every == 0 or iteration == args.iterations - 1:
                print(f"iteration {iteration:4d}  loss {global_loss:.4f}", flush=True)
    geryon.average_replicas()   # --sync partial: every replica ends equal (a no-op otherwise)
    elapsed = time.perf_counter() - started
    if job.is_main:
        summary = {"final": True, "loss": global_loss, "accuracy": accuracy(model, test_images, test_labels),
                   "iterations": args.iterations, "workers": job.world_size, "mode": job.mode,
                   "sync": job.sync,
                   "batch_size": local, "global_batch_size": global_batch,
                   "seconds": round(elapsed, 3), "images_per_s": round(done * global_batch / elapsed, 1),
                   "resumed_from": job.resumed_step}
        if args.log_json:
            print(json.dumps(summary), flush=True)
        else:
            print(f"final loss {summary['loss']:.4f}, test accuracy {summary['accuracy']:.1%}, "
                  f"{summary['images_per_s']:.0f} images/s on {job.world_size} worker(s)", flush=True)


if __name__ == "__main__":
    main()
