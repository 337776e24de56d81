"""The Geryon paper's evaluation figures (Wang et al., INFOCOM 2020, and its slides).

Scaling efficiency with 8 workers, per link and model: vanilla TensorFlow, Partition+Slicing,
Partition+Slicing+Geryon. The paper has no end-host (TicTac/P3) column in this table; its
slicing-size table compares Geryon with TicTac on VGG-19 at 10GbE (images/s, 8 workers).

This module is the one home of those figures: the simulator (geryon.sim) and `geryon bench paper`
(geryon.bench.paper_math) both read them here. A cell is (model, link, policy), in that order
everywhere; the paper's TicTac column goes by our name for that policy, `endhost`.
"""

from typing import NamedTuple


class PaperCell(NamedTuple):
    """One cell of the paper's scaling table."""
    model: str
    link: str
    policy: str


PAPER_WORKERS = 8
PAPER_EFFICIENCY = {   # (model, link) -> policy -> scaling efficiency
    ("alexnet", "10gbe"): {"vanilla": 0.364, "slicing": 0.802, "geryon": 0.954},
    ("vgg19", "10gbe"): {"vanilla": 0.269, "slicing": 0.793, "geryon": 0.946},
    ("resnet50", "10gbe"): {"vanilla": 0.876, "slicing": 0.900, "geryon": 0.957},
    ("alexnet", "40gbe"): {"vanilla": 0.794, "slicing": 0.900, "geryon": 0.951},
    ("vgg19", "40gbe"): {"vanilla": 0.617, "slicing": 0.853, "geryon": 0.948},
    ("resnet50", "40gbe"): {"vanilla": 0.941, "slicing": 0.941, "geryon": 0.961},
}
# slice size in parameters -> policy -> images/s, VGG-19, 10GbE, 8 workers (endhost: TicTac)
PAPER_SLICING = {1024 * 1024: {"geryon": 279.2, "endhost": 272.0},
                 512 * 1024: {"geryon": 276.0, "endhost": 268.0},
                 256 * 1024: {"geryon": 272.8, "endhost": 216.8}}
LINKS = {"10gbe": 10e9, "40gbe": 40e9}
CALIBRATION_CELL = PaperCell(model="vgg19", link="10gbe", policy="vanilla")


def paper_efficiency(model: str, link: str | None, policy: str) -> float | None:
    """The paper's scaling efficiency (0-1) for a cell, or None where it gives none (endhost, Inception)."""
    return PAPER_EFFICIENCY.get((model, link or ""), {}).get(policy)
