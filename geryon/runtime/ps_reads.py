"""PS mode: whatever the user reads of the model after optimizer.step() holds that step's values.

With the servers stepping (geryon.runtime.ps_sync), step() returns as soon as it has asked for the
next parameters; they arrive in the background and the next forward waits for each layer's own
(the overlap priority is for). Every other way of reading them must wait too, or it would see the
previous iteration's values without a word. `ParameterReads` makes the containers torch reads
parameters through wait for what they hold:
  module._parameters  of every module holding the model's parameters: a dict whose class is
                      `PendingParameters` from step() until that module's values are here, then
                      `CurrentParameters` (no method of its own: torch's own dict code, at dict
                      speed). Every read of the model goes through these dicts: parameters(),
                      named_parameters(), state_dict(), `model[0].weight` (nn.Module.__getattr__),
                      parameters_to_vector, swa_utils.AveragedModel.update_parameters, a copy.
  group["params"]     of every optimizer group: the same, as a list (`PendingGroupParams` /
                      `CurrentGroupParams`); optimizer.zero_grad() only touches .grad and does
                      not wait (`unwaited()`).
A read outside the forward waits only for the module or group it reads; the forward's own pre-hooks
flip their module's dict to current after their wait, so a forward costs nothing more.
What no container sees cannot wait: a tensor held in a variable from before step() (`w =
model[0].weight`, `list(model.parameters())` kept across steps). `geryon.wait_parameters(model)`
makes every parameter current. Buffers are not pulled (worker 0's are broadcast before each
training forward, geryon.runtime.ps_buffers), so reading them never waits.

Swapping `__class__` keeps one object: torch and the user keep their references to the dict and the
list, and the swap is one assignment. A copy (copy.deepcopy, pickle, AveragedModel's copy of the
model) waits for the values it copies and is a plain dict or list.
"""

import copy
from contextlib import contextmanager


class _Waiting:
    """What a dict or list of parameters needs to wait: the reads it belongs to, its tensors' indices."""

    __slots__ = ()

    def _wait(self) -> None:
        if self.reads.current(self):
            self.__class__ = self.current_class


class CurrentParameters(dict):
    """A module's `_parameters` whose values are current: a plain dict in every behaviour."""

    __slots__ = ("reads", "tensors")

    def __reduce_ex__(self, protocol):
        return dict, (), None, None, iter(self.items())

    def __deepcopy__(self, memo):
        result = {}
        memo[id(self)] = result
        for key, value in self.items():
            result[copy.deepcopy(key, memo)] = copy.deepcopy(value, memo)
        return result


class PendingParameters(_Waiting, CurrentParameters):
    """A module's `_parameters` after step(), before its values arrived: each read waits for them."""

    __slots__ = ()
    current_class = CurrentParameters

    def __getitem__(self, key):
        self._wait()
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        self._wait()
        return dict.get(self, key, default)

    def items(self):
        self._wait()
        return dict.items(self)

    def values(self):
        self._wait()
        return dict.values(self)

    def copy(self):
        self._wait()
        return dict(dict.items(self))


class CurrentGroupParams(list):
    """An optimizer group's "params" whose values are current: a plain list in every behaviour."""

    __slots__ = ("reads", "tensors")

    def __reduce_ex__(self, protocol):
        return list, (list(self),)

    def __deepcopy__(self, memo):
        result = []
        memo[id(self)] = result
        result.extend(copy.deepcopy(value, memo) for value in self)
        return result


class PendingGroupParams(_Waiting, CurrentGroupParams):
    """An optimizer group's "params" after step(), before their values arrived: reads wait."""

    __slots__ = ()
    current_class = CurrentGroupParams

    def __getitem__(self, index):
        self._wait()
        return list.__getitem__(self, index)

    def __iter__(self):
        self._wait()
        return list.__iter__(self)

    def __reversed__(self):
        self._wait()
        return list.__reversed__(self)

    def copy(self):
        self._wait()
        return list(list.__iter__(self))


class ParameterReads:
    """The waiting containers of one PS model and optimizer.

    `wait(tensors) -> bool` blocks until the tensors (indices into `params`) hold the last pulled
    version and returns True, or returns False when they cannot be waited for now (the values stay
    pending); `wait_all()` waits for every tensor (or fails saying why it cannot now) and calls
    mark_current().
    """

    def __init__(self, model, param_groups, params, wait, wait_all):
        self._wait, self.wait_all = wait, wait_all
        self._suspended = 0
        index = {id(p): i for i, p in enumerate(params)}
        self.containers = []
        for module in model.modules():
            own = module.__dict__.get("_parameters")
            tensors = _indices(own.values() if own is not None else (), index)
            if tensors:
                module.__dict__["_parameters"] = self._adopt(CurrentParameters(own), tensors)
        for group in param_groups:
            tensors = _indices(group["params"], index)
            if tensors:
                group["params"] = self._adopt(CurrentGroupParams(group["params"]), tensors)

    def _adopt(self, container, tensors):
        container.reads, container.tensors = self, tensors
        self.containers.append(container)
        return container

    def current(self, container) -> bool:
        """Wait for `container`'s values (a read); False: not now, leave it pending."""
        return self._suspended == 0 and self._wait(container.tensors)

    def mark_pending(self) -> None:
        """A pull was asked for: every read waits until its values are here."""
        for container in self.containers:
            container.__class__ = PendingParameters if isinstance(container, dict) else PendingGroupParams

    def mark_current(self, module=None) -> None:
        """Every value (or `module`'s own) is here: reads go at dict and list speed again."""
        if module is not None:
            own = module.__dict__.get("_parameters")
            if type(own) is PendingParameters:
                own.__class__ = CurrentParameters
            return
        for container in self.containers:
            container.__class__ = CurrentParameters if isinstance(container, dict) else CurrentGroupParams

    @contextmanager
    def unwaited(self):
        """Reads inside only touch .grad (zero_grad): let them through without waiting."""
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1


def _indices(tensors, index) -> list[int]:
    return sorted({index[id(t)] for t in tensors if t is not None and id(t) in index})


def wait_parameters(model) -> None:
    """Wait until every parameter of `model` holds the values of the last optimizer.step().

    Needed only for a tensor held from before step() (`w = model[0].weight` kept in a variable):
    every read through the model or the optimizer waits by itself. Nothing to do outside --mode ps
    with the servers stepping.
    """
    for module in model.modules():
        own = module.__dict__.get("_parameters")
        if isinstance(own, CurrentParameters):   # PendingParameters too
            own.reads.wait_all()
            return
