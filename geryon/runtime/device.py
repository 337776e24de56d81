"""The rank's device: its GPU when this process sees CUDA, else the CPU; and a script's --device.

Several ranks of one host share its GPUs by LOCAL_RANK, as torchrun scripts do: local rank r takes
visible GPU r mod count (more ranks than GPUs share them; geryon's flows are TCP, so that works).
`geryon.init()` makes that GPU the process's current CUDA device and exposes it as `ctx.device`.
"""

import torch

from geryon.errors import ConfigError

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def rank_device(local_rank: int) -> torch.device:
    """The GPU of local rank `local_rank` when CUDA is visible, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def select_device(choice: str, local_rank: int = 0) -> torch.device:
    """A script's --device: `auto` (the rank's GPU when there is one, else the CPU), `cpu`, or
    `cuda` (the rank's GPU; a ConfigError saying what to do when this process sees none)."""
    if choice not in DEVICE_CHOICES:
        raise ConfigError(f"--device {choice!r}: use one of {', '.join(DEVICE_CHOICES)}")
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(f"--device cuda: this process sees no CUDA GPU (torch {torch.__version__}, {build}); "
                          "run on a machine with a GPU and a CUDA build of torch, or use --device cpu "
                          "(or auto, which takes the GPU when there is one)")
    return rank_device(local_rank)


def server_device(choice: str, local_rank: int = 0) -> torch.device:
    """A parameter server's --server-device: the CPU, or (cuda) the rank's GPU, made current; a
    ConfigError saying what to do when this process sees no GPU."""
    from geryon import envvars as ev

    if choice not in ev.SERVER_DEVICES:
        raise ConfigError(f"--server-device {choice!r}: use one of {', '.join(ev.SERVER_DEVICES)}")
    if choice == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"--server-device cuda ({ev.SERVER_DEVICE}): this server sees no CUDA GPU "
                          f"(torch {torch.__version__}); run the servers where there is one, or use "
                          "--server-device cpu (the workers may still train on GPUs)")
    return use_rank_device(local_rank)


def use_rank_device(local_rank: int) -> torch.device:
    """Make the rank's GPU the process's current CUDA device (nothing on CPU); the device."""
    device = rank_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device
