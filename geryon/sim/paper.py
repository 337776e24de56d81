"""The Geryon paper's evaluation figures (slides, INFOCOM 2020; shared/papers/README.md).

Scaling efficiency with 8 workers, per link and model: vanilla TensorFlow, Partition+Slicing,
Partition+Slicing+Geryon. The paper has no end-host (TicTac/P3) column in this table; its
slicing-size table compares Geryon with TicTac on VGG-19 at 10GbE (images/s, 8 workers).
"""

PAPER_WORKERS = 8
PAPER_EFFICIENCY = {
    ("10gbe", "alexnet"): {"vanilla": 0.364, "slicing": 0.802, "geryon": 0.954},
    ("10gbe", "vgg19"): {"vanilla": 0.269, "slicing": 0.793, "geryon": 0.946},
    ("10gbe", "resnet50"): {"vanilla": 0.876, "slicing": 0.900, "geryon": 0.957},
    ("40gbe", "alexnet"): {"vanilla": 0.794, "slicing": 0.900, "geryon": 0.951},
    ("40gbe", "vgg19"): {"vanilla": 0.617, "slicing": 0.853, "geryon": 0.948},
    ("40gbe", "resnet50"): {"vanilla": 0.941, "slicing": 0.941, "geryon": 0.961},
}
# slice size in parameters -> (Geryon, TicTac) images/s, VGG-19, 10GbE, 8 workers
PAPER_SLICING = {1024 * 1024: (279.2, 272.0), 512 * 1024: (276.0, 268.0), 256 * 1024: (272.8, 216.8)}
LINKS = {"10gbe": 10e9, "40gbe": 40e9}
CALIBRATION_CELL = ("10gbe", "vgg19", "vanilla")


def paper_efficiency(link: str | None, model: str, policy: str) -> float | None:
    """The paper's scaling efficiency (0-1) for a cell, or None where the paper has none."""
    return PAPER_EFFICIENCY.get((link or "", model), {}).get(policy)
