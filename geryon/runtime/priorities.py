"""Which priority class each of a model's parameters gets, decided alike on every rank and checked.

The ranking is the categorizer's (`geryon.categorize.urgency.rank_parameters`): one no-grad forward
pass on a sample input, which geryon.runtime.api takes from the model's first real forward call. If that
pass fails (a model the ranking cannot trace), the fallback ranks parameters in module definition
order (`definition_order_ranking`), which for a feed-forward network is nearly the same.

The classes come from `--priority` (RankEnv.priority): `coarse` (everything before the first fully-connected layer
is class 0), `threshold=T` (one threshold over the urgency order) or `search` (the threshold is
searched during the first iterations and then kept: geryon.runtime.search_sync drives it, starting
from the search's first candidate; see `search_plan`).

Every rank publishes its assignment's digest in the job's store and compares all of them before
training starts; a rank that built another model (or another sample shape) stops with an error
that names the ranks that differ.
"""

import logging

from geryon.categorize.classes import Assignment, coarse_split, threshold_split
from geryon.categorize.urgency import RankedParameter, rank_parameters
from geryon.errors import ConfigError

log = logging.getLogger(__name__)


def definition_order_ranking(model) -> list[RankedParameter]:
    """Parameters in the order modules define them (the fallback when a forward cannot be traced)."""
    names = {id(p): n for n, p in model.named_parameters()}  # the name a parameter is known by
    ranking, seen = [], set()
    for module_name, module in model.named_modules():
        for param in module.parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            ranking.append(RankedParameter(names[id(param)], module_name, type(module).__name__,
                                           param.numel(), param.numel() * param.element_size()))
    return ranking


def rank_model(model, args, kwargs) -> tuple[list[RankedParameter], str]:
    """(ranking, how) from a forward pass on the given call arguments, or definition order."""
    if kwargs and not args:
        sample = dict(kwargs)
    else:
        sample = args[0] if len(args) == 1 else tuple(args)
    if kwargs and args:
        log.warning("geryon: the first forward has positional and keyword arguments; ranking "
                    "parameters by definition order")
        return definition_order_ranking(model), "definition order"
    try:
        return rank_parameters(model, sample), "first forward pass"
    except Exception as exc:  # noqa: BLE001 -- any tracing failure: fall back, never stop training
        log.warning("geryon: could not rank parameters by a forward pass (%r); using definition order", exc)
        return definition_order_ranking(model), "definition order"


def assignment_for(ranking: list[RankedParameter], scheme: str, max_classes: int) -> Assignment:
    """Split a ranking into classes by a fixed --priority scheme (`search` goes through `search_plan`)."""
    if scheme == "coarse":
        return coarse_split(ranking, max_classes=max_classes)
    key, _sep, value = scheme.partition("=")
    if key == "threshold":
        return threshold_split(ranking, [float(value)], max_classes=max_classes)
    raise ConfigError(f"unknown priority scheme {scheme!r}; use coarse, search or threshold=T")


def tensor_priorities(model, assignment: Assignment) -> list[tuple[int, int]]:
    """(class, urgency) of each tensor of `model.parameters()`, urgency = position in the ranking."""
    position = {name: i for i, name in enumerate(assignment.order)}
    classes = assignment.as_dict()
    return [(classes[name], position[name]) for name, _param in model.named_parameters()]


def agree_on_assignment(store, prefix: str, rank: int, world: int, assignment: Assignment) -> None:
    """Publish this rank's assignment digest and check that every worker has the same one."""
    mine = assignment.digest()
    store.set(f"{prefix}assignment/{rank}", mine)
    digests = {other: store.get(f"{prefix}assignment/{other}").decode() for other in range(world)}
    differ = sorted(r for r, d in digests.items() if d != mine)
    if differ:
        raise ConfigError(f"worker {rank} split the model's parameters into classes differently from "
                          f"workers {differ} (assignment digest {mine[:12]} vs "
                          f"{digests[differ[0]][:12]}): every worker must build the same model and "
                          "feed it inputs of the same shape")


def search_plan(model, args, kwargs, max_classes: int, store, prefix: str, job,
                context: dict | None = None):
    """--priority search: rank on this call's inputs, start the search (its first assignment agreed).

    `job` is the rank's RankEnv (rank, world size, the search's settings).
    Returns (TrainingSearch, (class, urgency) per tensor of model.parameters(), how it was ranked).
    """
    from geryon.runtime.search_sync import TrainingSearch

    ranking, how = rank_model(model, args, kwargs)
    context = {"model": type(model).__name__, "ranked_by": how, **(context or {})}
    search = TrainingSearch(ranking, max_classes, store, prefix, job, context)
    return search, tensor_priorities(model, search.assignment), how


def decide_priorities(model, args, kwargs, scheme: str, max_classes: int, store, prefix: str,
                      rank: int, world: int) -> tuple[Assignment, list[tuple[int, int]], str]:
    """Rank on this call's inputs, split into classes, check all workers agree.

    Returns (assignment, (class, urgency) per tensor of model.parameters(), how it was ranked).
    """
    ranking, how = rank_model(model, args, kwargs)
    assignment = assignment_for(ranking, scheme, max_classes)
    agree_on_assignment(store, prefix, rank, world, assignment)
    return assignment, tensor_priorities(model, assignment), how
