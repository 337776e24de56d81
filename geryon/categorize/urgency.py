"""Urgency of parameters: the order in which a real forward pass first uses them.

A parameter needed early in the forward pass is urgent: its pull (or allreduce result) blocks the
next iteration soonest. `rank_parameters` runs one real forward pass of a `torch.nn.Module` on a
sample input the caller gives and records, for every parameter, the moment it is first used:

- module forward pre-hooks keep a stack of the modules currently running, so a use is attributed to
  the innermost running module (the "layer", by qualified name) and its type;
- a `TorchFunctionMode` sees every torch operation and its arguments, so a parameter's position is
  its first use in an operation (a parameter owned by a parent module but used at the end of its
  forward is ranked at the end, not when the parent starts);
- a parameter of a module that ran but was never seen in an operation (a custom C++ op, say) is
  ranked where its module's pre-hook fired; parameters never used go last, in definition order.

A parameter shared by several modules appears once, under its first name in `named_parameters()`
order, ranked at its first use. The pass runs under `torch.no_grad()` and restores buffers
(BatchNorm running statistics) afterwards, so ranking leaves the model as it was. The result is a
pure function of the model's structure and the sample input's shape, so every rank that builds the
same model gets the same ranking (compare `ranking_digest`).
"""

import hashlib
import json
from dataclasses import asdict, dataclass

from geryon.errors import ConfigError


@dataclass(frozen=True)
class RankedParameter:
    """One parameter tensor in urgency order (0 = used first in the forward pass)."""

    name: str         # qualified name as in model.named_parameters(); for profiles, the layer name
    layer: str        # qualified name of the module (layer) that first uses it
    module_type: str  # class name of that module: "Conv2d", "Linear", or a profile's "Dense", ...
    numel: int
    bytes: int
    used: bool = True  # False: never used by the sample forward pass (ranked last)

    def to_dict(self) -> dict:
        return asdict(self)


def rank_parameters(model, sample_input) -> list["RankedParameter"]:
    """Rank every parameter of `model` by its first use in `model(sample_input)`.

    `sample_input` is a tensor, a tuple of positional arguments, or a dict of keyword arguments.
    """
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten

    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"rank_parameters needs a torch.nn.Module, got {type(model).__name__}")
    names = {}   # id(param) -> first qualified name
    params = {}  # id(param) -> param
    for name, param in model.named_parameters():  # deduplicates shared parameters
        names[id(param)] = name
        params[id(param)] = param
    module_names = {id(module): name for name, module in model.named_modules(remove_duplicate=False)}
    module_fallback = []  # (event position, id(param), module) from pre-hooks
    first_use = {}        # id(param) -> (position, layer, type)
    stack = []
    counter = [0]

    def note(param_id, module):
        if param_id in first_use:
            return
        layer = module_names.get(id(module), "") if module is not None else ""
        kind = type(module).__name__ if module is not None else type(model).__name__
        first_use[param_id] = (counter[0], layer, kind)
        counter[0] += 1

    def pre_hook(module, _inputs):
        stack.append(module)
        for param in module.parameters(recurse=False):
            module_fallback.append((counter[0], id(param), module))
        counter[0] += 1

    def post_hook(module, _inputs, _output):
        if stack and stack[-1] is module:
            stack.pop()

    class ParameterUse(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            leaves, _ = tree_flatten((args, kwargs))
            for leaf in leaves:
                if isinstance(leaf, torch.nn.Parameter) and id(leaf) in names:
                    note(id(leaf), stack[-1] if stack else None)
            return func(*args, **kwargs)

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(pre_hook))
        handles.append(module.register_forward_hook(post_hook))
    saved_buffers = [(buf, buf.detach().clone()) for buf in model.buffers()]
    try:
        with torch.no_grad(), ParameterUse():
            if isinstance(sample_input, dict):
                model(**sample_input)
            elif isinstance(sample_input, tuple):
                model(*sample_input)
            else:
                model(sample_input)
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for buf, saved in saved_buffers:
                buf.copy_(saved)
    positions = {}
    for param_id, (position, layer, kind) in first_use.items():
        positions[param_id] = (position, 0, layer, kind)
    for position, param_id, module in module_fallback:
        if param_id not in positions:
            positions[param_id] = (position, 1, module_names.get(id(module), ""), type(module).__name__)
    owners = _definition_owners(model)
    ranked, unused = [], []
    for index, (param_id, name) in enumerate(names.items()):
        param = params[param_id]
        size = dict(numel=param.numel(), bytes=param.numel() * param.element_size())
        if param_id in positions:
            position, tie, layer, kind = positions[param_id]
            ranked.append(((position, tie, index), RankedParameter(name, layer, kind, **size)))
        else:
            layer, kind = owners[name]
            unused.append(RankedParameter(name, layer, kind, used=False, **size))
    ranked.sort(key=lambda item: item[0])
    return [item for _, item in ranked] + unused


def _definition_owners(model) -> dict[str, tuple[str, str]]:
    """Map each parameter's first name to the (qualified name, type) of the module defining it."""
    owners = {}
    for module_name, module in model.named_modules():
        for local, _param in module.named_parameters(recurse=False):
            full = f"{module_name}.{local}" if module_name else local
            owners.setdefault(full, (module_name, type(module).__name__))
    return owners


def ranking_digest(ranking: list[RankedParameter]) -> str:
    """sha256 of the ranking's canonical JSON: equal on every rank that built the same model."""
    canonical = json.dumps([p.to_dict() for p in ranking], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
