"""Which side runs the user's optimizer in PS mode, and the optimizer object the script gets back.

`choose_update(optimizer, params, requested)` decides, before training starts:
  server  the optimizer is an exact torch.optim class known to be elementwise (server_optimizer.ELEMENTWISE)
          with plain-number settings: every server runs that class over its shards, and
          `geryon.distribute` returns a `PSOptimizer` whose step() pushes and pulls;
  worker  anything else (LAMB, LARS, Adafactor, a subclass, a tensor learning rate): the servers
          average the gradients and every worker runs the user's own optimizer on the average, as
          BytePS does (geryon.runtime.ps_worker_step); the user's optimizer is returned unchanged.
`--ps-optimizer server|worker` (GERYON_PS_OPTIMIZER) overrides `auto`; `server` for an optimizer
the servers cannot run, LBFGS or SparseAdam fail here, naming the reason.

`PSOptimizer` is a torch.optim.Optimizer subclass sharing the user's optimizer's param_groups, so
learning-rate schedulers (made before or after distribute) and manual edits change what the next
step() sends to the servers, and schedulers see step() called as they expect. state_dict() gathers
the shards' state from the servers into torch's own format; load_state_dict() scatters it (and the
model's current parameters) to them. clip_grad_norm_() asks the servers to clip the averaged
gradient by its global norm at this step.
"""

from collections import OrderedDict

import torch

from geryon.errors import ConfigError

UPDATE_MODES = ("auto", "server", "worker")


def choose_update(optimizer, params, requested: str = "auto"):
    """('server', OptimizerSpec, why) or ('worker', None, why) for this optimizer; ConfigError if neither."""
    from geryon.transport.server_optimizer import UNSUPPORTED, describe_optimizer

    if requested not in UPDATE_MODES:
        raise ConfigError(f"--ps-optimizer {requested!r}: choose one of {', '.join(UPDATE_MODES)}")
    name = type(optimizer).__name__
    if name in UNSUPPORTED and type(optimizer).__module__.startswith("torch.optim"):
        raise ConfigError(f"--mode ps cannot run {name}: {UNSUPPORTED[name]}; use --mode allreduce")
    model_ids = {id(p) for p in params}
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) not in model_ids:
                raise ConfigError("the optimizer holds a tensor that is not one of the model's "
                                  "parameters: geryon.distribute(model, optimizer) needs an optimizer "
                                  "over model.parameters()")
    if requested == "worker":
        return "worker", None, "--ps-optimizer worker"
    try:
        spec = describe_optimizer(optimizer, params)
    except ConfigError as why:
        if requested == "server":
            raise ConfigError(f"--ps-optimizer server: {why}") from None
        return "worker", None, str(why)
    return "server", spec, f"{name} is elementwise"


def describe_choice(optimizer, mode: str, why: str, servers: int) -> str:
    name = type(optimizer).__name__
    if mode == "server":
        return (f"geryon: --mode ps: the {servers} parameter server(s) run {name} on their shards "
                f"({why}; --ps-optimizer worker to step on the workers)")
    return (f"geryon: --mode ps: the parameter servers average gradients and every worker runs {name} "
            f"({why})")


class PSOptimizer(torch.optim.Optimizer):
    """The user's optimizer, run by the parameter servers: step() pushes gradients, pulls parameters.

    It shares the wrapped optimizer's param_groups (schedulers and edits apply to both); nothing is
    updated on the worker, and the worker holds no optimizer state (see state_dict()).
    """

    def __init__(self, optimizer, sync):  # no Optimizer.__init__: nothing local to build
        self.__dict__["_inner"] = optimizer
        self._sync = sync
        for name in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
                     "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                     "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks"):
            setattr(self, name, OrderedDict())
        self._patch_step_function()

    # the wrapped optimizer's own data, shared
    @property
    def param_groups(self):
        return self._inner.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self._inner.param_groups = value

    @property
    def defaults(self):
        return self._inner.defaults

    @defaults.setter
    def defaults(self, value):
        self._inner.defaults = value

    @property
    def state(self):
        return self._inner.state

    @state.setter
    def state(self, value):
        self._inner.state = value

    def __getattr__(self, name):
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"PSOptimizer({self._inner!r})"

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._synchronize()
        self._inner._opt_called = True  # a scheduler made on the wrapped optimizer sees the step
        return loss

    def _synchronize(self) -> None:
        """step()'s work between the closure and the scheduler's mark: push, update, pull."""
        self._sync.push_pull()

    def zero_grad(self, set_to_none: bool = True) -> None:
        with self._sync.reads.unwaited():   # .grad only: the parameters may still be arriving
            self._inner.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group) -> None:
        raise ConfigError("add_param_group() after geryon.distribute() is not supported in --mode ps: "
                          "give the optimizer every group before distributing")

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0):
        """Clip this step's averaged gradient to `max_norm` by its global norm (on the servers).

        As torch.nn.utils.clip_grad_norm_ over all the model's parameters in one process on the
        global batch; call it after backward, before step(). Returns None: the norm is known only
        on the servers.
        """
        self._sync.request_clip(float(max_norm), float(norm_type))

    def synchronize(self) -> None:
        """Wait until every parameter holds the servers' latest version (geryon.wait_parameters)."""
        self._sync.wait_all()

    def state_dict(self):
        return self._sync.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self._sync.load_state_dict(state_dict)


def clip_grad_norm_(optimizer, max_norm: float, norm_type: float = 2.0):
    """Clip the gradients of `optimizer`'s parameters by their global norm, in any geryon mode.

    With a PSOptimizer (--mode ps, the servers stepping) the servers clip the averaged gradient;
    otherwise (one process, allreduce, or the workers stepping: .grad already holds the average)
    this is torch.nn.utils.clip_grad_norm_ over the optimizer's parameters, and returns the norm.
    """
    if isinstance(optimizer, PSOptimizer):
        return optimizer.clip_grad_norm_(max_norm, norm_type)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
