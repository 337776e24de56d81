"""PS mode: what a script reads after optimizer.step() holds that step's values (geryon.runtime.ps_reads).

Under `python -m geryon.launch --mode ps` (the servers stepping, pulling at step() or ahead), every
step of tests/ps_reads_script.py reads the model in eight ways -- parameters(), a weight norm through
`model[0].weight`, parameters_to_vector, the optimizer's param_groups, an AveragedModel (EMA) updated
every step, a submodule's named_parameters, a tensor held from before training after
geryon.wait_parameters, state_dict() -- each one first in turn, and must get one process's values on
the same global batch; the EMA model's own forward is a plain local model's. The containers
themselves are checked without a job: what each read waits for, and what a copy is.
"""

import copy
import io

import pytest
import torch

from geryon.runtime.ps_reads import (CurrentGroupParams, CurrentParameters, ParameterReads, PendingGroupParams,
                                     PendingParameters, wait_parameters)
from launch_support import REPO, one_process_result, run_launcher

SCRIPT = REPO / "tests" / "ps_reads_script.py"


class Waits:
    """The reads' wait functions: record what was waited for; `ready` False: cannot wait now."""

    def __init__(self):
        self.calls, self.all, self.ready = [], 0, True

    def wait(self, tensors) -> bool:
        self.calls.append(list(tensors))
        return self.ready

    def wait_all(self) -> None:
        self.all += 1
        self.reads.mark_current()


def _reads():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    waits = Waits()
    waits.reads = ParameterReads(model, optimizer.param_groups, list(model.parameters()), waits.wait,
                                 waits.wait_all)
    return model, optimizer, waits


def test_a_read_waits_for_the_module_it_reads_once():
    model, optimizer, waits = _reads()
    weight = model[2].weight
    assert waits.calls == [] and type(model[0]._parameters) is CurrentParameters
    waits.reads.mark_pending()
    assert model[2].weight is weight                      # nn.Module.__getattr__
    assert waits.calls == [[2, 3]]                         # layer 2's weight and bias only
    assert type(model[2]._parameters) is CurrentParameters and type(model[0]._parameters) is PendingParameters
    assert model[2].bias is not None and waits.calls == [[2, 3]]   # current now: no second wait
    assert len(list(model.parameters())) == 4 and waits.calls == [[2, 3], [0, 1]]
    waits.reads.mark_pending()
    first = next(iter(optimizer.param_groups[0]["params"]))
    assert waits.calls[-1] == [0, 1, 2, 3]                 # the group's four tensors
    assert type(optimizer.param_groups[0]["params"]) is CurrentGroupParams
    assert first is model[0].weight and waits.calls[-1] == [0, 1]   # each container waits on its own


def test_zero_grad_and_reads_that_cannot_wait_leave_the_values_pending():
    model, optimizer, waits = _reads()
    weight = model[0].weight
    model(torch.ones(1, 3)).sum().backward()
    waits.reads.mark_pending()
    with waits.reads.unwaited():
        optimizer.zero_grad()
    assert waits.calls == [] and weight.grad is None
    waits.ready = False   # --ps-pull ahead between backward and step(): values in flux, no wait
    list(model.parameters())
    assert type(model[0]._parameters) is PendingParameters
    assert type(optimizer.param_groups[0]["params"]) is PendingGroupParams
    wait_parameters(model)
    assert waits.all == 1 and type(model[0]._parameters) is CurrentParameters


def test_a_copy_waits_for_what_it_copies_and_is_plain():
    model, optimizer, waits = _reads()
    waits.reads.mark_pending()
    twin = copy.deepcopy(model)
    assert type(twin[0]._parameters) is dict and type(twin[2]._parameters) is dict
    assert sorted(map(tuple, waits.calls)) == [(0, 1), (2, 3)]
    assert torch.equal(twin[0].weight, model[0].weight) and twin[0].weight is not model[0].weight
    waits.reads.mark_pending()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    assert len(waits.calls) == 4
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    assert type(loaded[0]._parameters) is dict and torch.equal(loaded[2].bias, model[2].bias)
    group = copy.deepcopy(optimizer.param_groups[0])
    assert type(group["params"]) is list and len(group["params"]) == 4


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return one_process_result(SCRIPT, tmp_path_factory.mktemp("single") / "reads.pt")


@pytest.mark.slow
@pytest.mark.parametrize("pull", ["end", "ahead"])
def test_every_read_after_step_is_the_one_process_value(tmp_path, single, pull):
    out = tmp_path / "reads.pt"
    result = run_launcher("--local", "--mode", "ps", "--workers", "2", "--servers", "1", "--ps-pull", pull,
                          SCRIPT, "--out", out, timeout=240)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    got = torch.load(out, weights_only=True)
    assert len(got["reads"]) == len(single["reads"])
    for step, (row, want) in enumerate(zip(got["reads"], single["reads"])):
        assert row.keys() == want.keys()
        for name in want:
            assert row[name] == pytest.approx(want[name], rel=1e-5, abs=1e-6), f"{name} after step {step}"
    for part in ("params", "ema"):
        for key in single[part]:
            torch.testing.assert_close(got[part][key], single[part][key], rtol=1e-5, atol=1e-6, msg=key)
    assert got["ema_output"] == pytest.approx(single["ema_output"], rel=1e-5, abs=1e-6)
