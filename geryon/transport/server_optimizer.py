"""The user's optimizer as data, for the parameter servers: which class, which groups, what state.

A parameter server updates flat slices ("shards") of the model's tensors. An optimizer whose update
is elementwise (every element's new value depends only on that element's parameter, gradient and
state, plus scalars such as the step count) gives the same numbers on a slice as on the whole
tensor, so the servers run the user's real `torch.optim` class over their shards. `ELEMENTWISE` is
the allow-list of such classes (exact classes: a subclass may override step, so it is not on it).

`OptimizerSpec` describes the optimizer with plain data only -- the class name (checked against
the allow-list), each parameter group's hyper-parameters (JSON values), and the group of each tensor
(-1: in no group, never updated) -- so it travels as JSON and nothing is ever unpickled.
`OptimizerSpec(MEAN)` is the other mode: the servers only average, the workers step.

Hyper-parameters change during training (schedulers, warm-up, manual edits). `hyper_vector` flattens
every group's numeric hyper-parameters (bools, ints, floats, tuples of them) into one float64
vector in a fixed order, which the workers send with every iteration; `apply_hyper` puts it back
into a server's per-shard optimizers. Non-numeric values (None, strings) must not change; a change
is refused by `check_groups` before it could be silently ignored.

`shard_state` / `full_state` convert optimizer state between a whole tensor and its shards:
per-element tensors (the shape of the parameter; 1-D on a shard) are sliced or concatenated,
scalars (0-dim tensors such as Adam's `step`, Python numbers) are the same on every shard.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass

import torch

from geryon.errors import ConfigError

MEAN = "mean"   # the servers average gradients; every worker runs its own optimizer
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta",
               "Rprop", "ASGD")
UNSUPPORTED = {"LBFGS": "it re-evaluates the loss several times per step (closure)",
               "SparseAdam": "it needs sparse gradients"}
SCALAR_STATE = frozenset({"step", "eta", "mu"})   # state keys that are scalars even on 0-dim parameters
STEP_HEADER = 3   # clip flag, max_norm, norm_type ahead of the hyper-parameters in a step vector


def _is_number(value) -> bool:
    return isinstance(value, (bool, int, float)) and not isinstance(value, complex)


def _plain(value):
    """`value` as JSON-able plain data, or raise ValueError."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, (tuple, list)) and all(_is_number(v) for v in value):
        return list(value)
    raise ValueError(type(value).__name__)


@dataclass(frozen=True)
class OptimizerSpec:
    """What the servers need to run the user's optimizer: class name, group settings, tensor groups."""

    name: str
    groups: tuple = ()          # per group: {hyper-parameter: plain value}
    tensor_group: tuple = ()    # per tensor: its group index, -1 for none
    defaults: dict | None = None

    @property
    def mean_only(self) -> bool:
        return self.name == MEAN

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "groups": list(self.groups),
                           "tensor_group": list(self.tensor_group), "defaults": self.defaults or {}},
                          allow_nan=True)

    @classmethod
    def from_json(cls, text: str) -> "OptimizerSpec":
        data = json.loads(text)
        name = data.get("name")
        if name != MEAN and name not in ELEMENTWISE:
            raise ConfigError(f"optimizer {name!r} cannot run on the parameter servers "
                              f"(elementwise torch.optim classes: {', '.join(ELEMENTWISE)})")
        groups = tuple(dict(g) for g in data.get("groups", ()))
        tensor_group = tuple(int(g) for g in data.get("tensor_group", ()))
        if any(g < -1 or g >= len(groups) for g in tensor_group):
            raise ConfigError("optimizer spec names a parameter group that does not exist")
        return cls(name, groups, tensor_group, dict(data.get("defaults") or {}))

    # -- per-iteration hyper-parameters --------------------------------------------------------
    def hyper_length(self) -> int:
        return len(hyper_vector(self.groups, self))

    def build(self, group: int, param: torch.Tensor) -> torch.optim.Optimizer:
        """One instance of the user's class over one shard, with group `group`'s settings."""
        cls = getattr(torch.optim, self.name)
        accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
        kwargs = {k: _restore(v) for k, v in (self.defaults or {}).items() if k in accepted}
        settings = {k: _restore(v) for k, v in self.groups[group].items()}
        return cls([{"params": [param], **settings}], **kwargs)


def _restore(value):
    return tuple(value) if isinstance(value, list) else value


def describe_optimizer(optimizer, params) -> OptimizerSpec:
    """The spec of a torch optimizer over `params` (the model's parameters, in order).

    Raises ConfigError when the servers cannot run it: a class not on the allow-list, a
    hyper-parameter that is not plain data, a parameter the model does not have.
    """
    cls = type(optimizer)
    if cls.__module__.split(".")[:2] != ["torch", "optim"] or cls.__name__ not in ELEMENTWISE \
            or getattr(torch.optim, cls.__name__, None) is not cls:
        raise ConfigError(f"{cls.__name__} is not a torch.optim class known to be elementwise "
                          f"({', '.join(ELEMENTWISE)})")
    index = {id(p): i for i, p in enumerate(params)}
    tensor_group = [-1] * len(params)
    groups = []
    for number, group in enumerate(optimizer.param_groups):
        for param in group["params"]:
            if id(param) not in index:
                raise ConfigError(f"parameter group {number} holds a tensor that is not one of the "
                                  "model's parameters; geryon.distribute(model, optimizer) needs an "
                                  "optimizer over model.parameters()")
            if tensor_group[index[id(param)]] != -1:
                raise ConfigError("a parameter is in two parameter groups")
            tensor_group[index[id(param)]] = number
        groups.append(group_settings(group, number))
    defaults = {}
    for key, value in optimizer.defaults.items():
        try:
            defaults[key] = _plain(value)
        except ValueError:
            continue   # the groups carry every setting; defaults only matter to the constructor
    return OptimizerSpec(cls.__name__, tuple(groups), tuple(tensor_group), defaults)


def group_settings(group: dict, number: int) -> dict:
    """A parameter group's hyper-parameters as plain data (raises ConfigError otherwise)."""
    settings = {}
    for key in sorted(group):
        if key == "params":
            continue
        try:
            settings[key] = _plain(group[key])
        except ValueError as exc:
            raise ConfigError(f"parameter group {number}'s {key!r} is a {exc}, which the parameter "
                              "servers cannot take: use a plain number, or let the workers step "
                              "(--ps-optimizer worker)") from None
    return settings


def hyper_vector(groups, spec: OptimizerSpec) -> list[float]:
    """Every numeric hyper-parameter of `groups`, in the spec's order, as floats."""
    values = []
    for template, group in zip(spec.groups, groups):
        for key in template:
            value = group[key]
            if isinstance(value, (list, tuple)):
                values.extend(float(v) for v in value)
            elif _is_number(value):
                values.append(float(value))
    return values


def check_groups(param_groups, spec: OptimizerSpec) -> list[dict]:
    """The current settings of the user's groups, checked to still fit the spec.

    Numbers may change freely (that is what schedulers do); adding or removing a group or one of
    the optimizer's settings, changing a tuple's length, or changing a non-numeric value (None, a
    string) is refused. Keys the optimizer does not know (a scheduler's `initial_lr` added later)
    are ignored: they cannot change an update.
    """
    if len(param_groups) != len(spec.groups):
        raise ConfigError(f"the optimizer has {len(param_groups)} parameter groups, the parameter "
                          f"servers were given {len(spec.groups)}: add_param_group() after the first "
                          "forward pass is not supported in --mode ps")
    current = []
    for number, (template, group) in enumerate(zip(spec.groups, param_groups)):
        known = set(template) | set(spec.defaults or {})
        settings = group_settings({k: v for k, v in group.items() if k in known}, number)
        changed = sorted(settings.keys() ^ template.keys())
        if changed:
            raise ConfigError(f"parameter group {number} gained or lost settings {changed} after the "
                              "first forward pass; the parameter servers cannot follow that")
        for key, old in template.items():
            new = settings[key]
            numeric = (_is_number(old) and _is_number(new)) or (
                isinstance(old, list) and isinstance(new, list) and len(old) == len(new))
            if not numeric and old != new:
                raise ConfigError(f"parameter group {number}'s {key!r} changed from {old!r} to "
                                  f"{new!r}; the parameter servers can follow changes of numbers only")
        current.append(settings)
    return current


def apply_hyper(optimizer: torch.optim.Optimizer, template: dict, values, start: int) -> int:
    """Write one group's hyper-parameters from `values[start:]` into `optimizer`'s only group."""
    group = optimizer.param_groups[0]
    at = start
    for key, old in template.items():
        if isinstance(old, list):
            group[key] = tuple(float(v) for v in values[at:at + len(old)])
            at += len(old)
        elif isinstance(old, bool):
            group[key] = bool(values[at])
            at += 1
        elif _is_number(old):
            value = float(values[at])
            group[key] = int(value) if isinstance(old, int) and value.is_integer() else value
            at += 1
    return at


def group_offsets(spec: OptimizerSpec) -> list[int]:
    """Where each group's hyper-parameters start in a hyper vector."""
    offsets, at = [], 0
    for template in spec.groups:
        offsets.append(at)
        at += sum(len(v) if isinstance(v, list) else 1 for v in template.values()
                  if isinstance(v, list) or _is_number(v))
    return offsets


# -- state between whole tensors and shards ------------------------------------------------------
def shard_state(state: dict, param: torch.Tensor, offset: int, length: int) -> dict:
    """The part of one tensor's optimizer state that belongs to its shard [offset, offset + length)."""
    part = {}
    for key, value in state.items():
        if torch.is_tensor(value) and _per_element(key, value, param):
            part[key] = value.detach().reshape(-1)[offset:offset + length].clone()
        elif torch.is_tensor(value):
            part[key] = value.detach().clone()
        else:
            part[key] = value
    return part


def _per_element(key: str, value: torch.Tensor, param: torch.Tensor) -> bool:
    if param.dim() == 0:
        return value.dim() == 0 and key not in SCALAR_STATE
    return value.dim() > 0 and value.shape == param.shape


def full_state(parts, param: torch.Tensor) -> dict:
    """One tensor's optimizer state from its shards' states: [(offset, state), ...]."""
    parts = sorted(parts, key=lambda item: item[0])
    if not parts or not parts[0][1]:
        return {}
    state = {}
    for key, first in parts[0][1].items():
        if torch.is_tensor(first) and first.dim() == 1:
            whole = torch.empty(param.numel(), dtype=first.dtype)
            for offset, part in parts:
                piece = part[key]
                whole[offset:offset + piece.numel()] = piece
            state[key] = whole.reshape(param.shape)
        else:
            state[key] = first
    return state
