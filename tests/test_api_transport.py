"""The glue between the in-script API and geryon's transport: config from the environment, priorities."""

from datetime import timedelta

import pytest
import torch
from torch import nn

from geryon.errors import ConfigError
from geryon.runtime import jobtransport
from geryon.runtime.env import RankEnv
from geryon.runtime.ddp_sync import BucketPriorities
from geryon.runtime.priorities import (agree_on_assignment, assignment_for, decide_priorities,
                                      definition_order_ranking, tensor_priorities)
from geryon.runtime.ps_sync import decode_spec, encode_spec
from geryon.transport.server_optimizer import describe_optimizer


class Net(nn.Module):
    """Defined in one order, used in another: the ranking must follow use, the fallback definition."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 3)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1)[:, :8])


def test_transport_config_from_the_launchers_variables():
    env = {"GERYON_JOB_SECRET": "s3cret", "GERYON_JOB_ID": "jabc12", "GERYON_POLICY": "geryon",
           "GERYON_CLASSES": "high:46,mid:26,low:0", "GERYON_TRANSPORT_TIMEOUT": "2.5",
           "GERYON_THREAD_RT": "3"}
    config = jobtransport.transport_config(RankEnv.from_environ(env))
    assert (config.policy, config.class_dscp, config.timeout) == ("geryon", (46, 26, 0), 2.5)
    assert config.thread_rt_priority == 3
    assert config.connect_timeout is None and config.start_timeout == 2.5
    config = jobtransport.transport_config(RankEnv.from_environ({**env, "GERYON_CONNECT_TIMEOUT": "90"}))
    assert (config.timeout, config.connect_timeout, config.start_timeout) == (2.5, 90.0, 90.0)
    assert config.job_id == jobtransport.transport_job_id("jabc12") != jobtransport.transport_job_id("jabc13")
    assert jobtransport.transport_config(RankEnv(secret="x")).class_dscp == (46, 0)
    assert RankEnv.from_environ(env).has_transport and not RankEnv.from_environ({}).has_transport
    with pytest.raises(ConfigError, match="GERYON_TRANSPORT_TIMEOUT"):
        RankEnv.from_environ({"GERYON_TRANSPORT_TIMEOUT": "soon"})
    for bad in ("soon", "0", "-3", "nan", "inf"):
        with pytest.raises(ConfigError, match="GERYON_CONNECT_TIMEOUT"):
            RankEnv.from_environ({"GERYON_CONNECT_TIMEOUT": bad})
    for bad in ("high", "100", "-1"):
        with pytest.raises(ConfigError, match="GERYON_THREAD_RT"):
            RankEnv.from_environ({"GERYON_THREAD_RT": bad})


def test_ps_placement_from_the_launchers_variable():
    """Byte-balanced unless the job says count; every rank reads the same variable."""
    secret = {"GERYON_JOB_SECRET": "s3cret"}
    assert jobtransport.transport_config(RankEnv.from_environ(secret)).placement == "bytes"
    count = RankEnv.from_environ({**secret, "GERYON_PS_PLACEMENT": "count"})
    assert jobtransport.transport_config(count).placement == "count"
    with pytest.raises(ConfigError, match="GERYON_PS_PLACEMENT='even'"):
        RankEnv.from_environ({"GERYON_PS_PLACEMENT": "even"})


def test_reserved_port_can_still_be_listened_on():
    reservation = jobtransport.reserve_port("127.0.0.1")
    port = reservation.getsockname()[1]
    import socket

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
        listener.listen()
    finally:
        listener.close()
        reservation.close()


def test_classes_follow_the_forward_pass_and_fall_back_to_definition_order():
    model = Net()
    ranking = [p.name for p in definition_order_ranking(model)]
    assert ranking == ["head.weight", "head.bias", "conv.weight", "conv.bias"]
    store = torch.distributed.HashStore()
    assignment, priorities, how = decide_priorities(model, (torch.zeros(1, 1, 4, 4),), {}, "coarse", 2,
                                                    store, "geryon/", 0, 1)
    assert how == "first forward pass"
    assert assignment.order == ("conv.weight", "conv.bias", "head.weight", "head.bias")
    # model.parameters() order: head.weight, head.bias, conv.weight, conv.bias
    assert tensor_priorities(model, assignment) == [(1, 2), (1, 3), (0, 0), (0, 1)]
    threshold = assignment_for(definition_order_ranking(model), "threshold=0.75", 2)
    assert threshold.class_of == (0, 0, 0, 1)


def test_ranks_with_different_assignments_fail_clearly():
    store = torch.distributed.HashStore()
    store.set_timeout(timedelta(seconds=2))
    ranking = definition_order_ranking(Net())
    store.set("geryon/assignment/1", assignment_for(ranking, "threshold=0.5", 2).digest())
    with pytest.raises(ConfigError, match=r"differently from workers \[1\]"):
        agree_on_assignment(store, "geryon/", 0, 2, assignment_for(ranking, "coarse", 2))


def test_a_bucket_takes_its_most_urgent_parameter():
    model = Net()
    params = list(model.parameters())
    priorities = BucketPriorities()
    priorities.set_tensor_priorities(params, [(1, 2), (1, 3), (0, 0), (0, 1)])

    class Bucket:
        def __init__(self, members, index=0):
            self.members, self._index = members, index

        def parameters(self):
            return self.members

        def index(self):
            return self._index

    assert priorities.of_bucket(Bucket(params[:2])) == (1, 2)
    assert priorities.of_bucket(Bucket(params[1:3])) == (0, 0)
    assert priorities.of_bucket(Bucket([torch.zeros(1)], index=4)) == (0, 4)


def test_ps_spec_carries_the_optimizer_as_json_and_values_as_tensors():
    model = Net()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}],
                                  lr=0.1)
    spec = decode_spec(encode_spec(params, [(0, 0)] * 4, describe_optimizer(optimizer, params)))
    assert all(torch.equal(a, b) for a, b in zip(spec["values"], params))
    assert spec["optimizer"].name == "AdamW" and spec["optimizer"].tensor_group == (0, 0, 1, 1)
    assert spec["optimizer"].groups[1]["weight_decay"] == 0.0 and spec["optimizer"].groups[0]["lr"] == 0.1
