"""Urgency ranking on real torch models: first use in a real forward pass."""

import pytest
import torch
from torch import nn

from geryon.categorize.urgency import rank_parameters, ranking_digest
from geryon.categorize.zoo import ZOO_NAMES, build_model
from geryon.errors import ConfigError


def names(ranking):
    return [p.name for p in ranking]


def test_cnn_with_conv_bn_fc_ranks_in_forward_order_with_sizes():
    model, sample = build_model("smallcnn")
    ranking = rank_parameters(model, sample)
    assert names(ranking) == ["conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "conv2.weight",
                              "conv2.bias", "bn2.weight", "bn2.bias", "fc1.weight", "fc1.bias",
                              "fc2.weight", "fc2.bias"]
    first = ranking[0]
    assert (first.layer, first.module_type, first.numel, first.bytes) == ("conv1", "Conv2d", 864, 3456)
    assert ranking[2].module_type == "BatchNorm2d" and ranking[-1].module_type == "Linear"
    assert all(p.used for p in ranking)


class ReorderedNet(nn.Module):
    """Modules defined head first, used tail first; one parameter owned by the root, used last."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 4)
        self.body = nn.Conv2d(8, 4, 3, padding=1)
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.scale = nn.Parameter(torch.ones(1))
        self.spare = nn.Linear(4, 4)  # never used

    def forward(self, x):
        x = self.norm(self.body(self.stem(x)))
        x = nn.functional.adaptive_avg_pool2d(x, 2).flatten(1)
        return self.head(x) * self.scale


def test_definition_order_differs_from_forward_order():
    ranking = rank_parameters(ReorderedNet(), torch.randn(2, 3, 8, 8))
    assert names(ranking) == ["stem.weight", "stem.bias", "body.weight", "body.bias", "norm.weight",
                              "norm.bias", "head.weight", "head.bias", "scale", "spare.weight", "spare.bias"]
    scale = ranking[8]
    assert scale.layer == "" and scale.module_type == "ReorderedNet"  # used by the root, after head
    assert [p.used for p in ranking[-2:]] == [False, False]
    assert ranking[-1].layer == "spare"


class SharedNet(nn.Module):
    """An encoder/decoder pair sharing one weight (tied), the decoder defined first."""

    def __init__(self):
        super().__init__()
        self.decoder = nn.Linear(6, 10, bias=False)
        self.encoder = nn.Linear(10, 6, bias=False)
        self.decoder.weight = self.encoder.weight  # tied (shapes transpose via F.linear below)
        self.mid = nn.Linear(6, 6)

    def forward(self, x):
        h = self.mid(self.encoder(x))
        return nn.functional.linear(h, self.decoder.weight.t())


def test_shared_parameter_appears_once_at_first_use():
    model = SharedNet()
    ranking = rank_parameters(model, torch.randn(3, 10))
    assert names(ranking) == ["decoder.weight", "mid.weight", "mid.bias"]  # first name, first use
    assert ranking[0].layer == "encoder"  # first used by the encoder, although named after the decoder
    assert sum(p.numel for p in ranking) == sum(p.numel() for p in model.parameters())


def test_module_called_twice_keeps_first_use():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(nn.Linear(4, 4), shared, nn.ReLU(), shared)
    ranking = rank_parameters(model, torch.randn(2, 4))
    assert names(ranking) == ["0.weight", "0.bias", "1.weight", "1.bias"]


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_ranking_is_identical_for_independently_built_models(name):
    first = rank_parameters(*build_model(name))
    torch.manual_seed(123)  # different initial values must not matter
    second = rank_parameters(*build_model(name))
    assert ranking_digest(first) == ranking_digest(second)
    assert len(first) == len(list(build_model(name)[0].parameters()))


def test_ranking_leaves_batchnorm_statistics_and_mode_alone():
    model, sample = build_model("smallcnn")
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rank_parameters(model, sample)
    assert model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_miniresnet_shortcut_after_main_branch_and_fc_last():
    ranking = rank_parameters(*build_model("miniresnet"))
    order = names(ranking)
    assert order[0] == "stem.0.weight" and order[-2:] == ["fc.weight", "fc.bias"]
    assert order.index("blocks.2.conv2.weight") < order.index("blocks.2.shortcut.0.weight")


def test_keyword_and_tuple_inputs_and_bad_model():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

        def forward(self, x, y):
            return self.b(y) + self.a(x)

    model = TwoInputs()
    x = torch.randn(1, 2)
    assert names(rank_parameters(model, (x, x)))[:2] == ["b.weight", "b.bias"]
    assert names(rank_parameters(model, {"x": x, "y": x}))[:2] == ["b.weight", "b.bias"]
    with pytest.raises(ConfigError):
        rank_parameters(lambda v: v, x)
