"""Per-layer profiles: parsing, validation, forward order, the derived AlexNet profile."""

import copy
import json

import pytest

from geryon.categorize.derived import alexnet_profile
from geryon.categorize.profiles import (PROFILE_NAMES, coarse_type, load_profile, parse_profile,
                                        profiles_dir, resolve_profile)
from geryon.errors import ConfigError, ProfileError


def test_named_profiles_match_the_readme_totals():
    expected = {"vgg16": (39.2, 86.8, 138.4), "vgg19": (46.4, 101.1, 143.7),
                "resnet50": (42.7, 64.3, 25.6), "inceptionv3": (56.6, 87.9, 23.9)}
    for name, (forward_ms, backward_ms, mparams) in expected.items():
        profile = resolve_profile(name)
        assert profile.batch == 32 and not profile.derived
        assert profile.forward_ns / 1e6 == pytest.approx(forward_ms, abs=0.11)
        assert profile.backward_ns / 1e6 == pytest.approx(backward_ms, abs=0.11)
        assert profile.param_bytes / 4e6 == pytest.approx(mparams, abs=0.06)


def test_forward_order_starts_at_input_ends_at_output_and_respects_edges():
    vgg = resolve_profile("vgg19")
    assert [l.name for l in vgg.layers][:2] == ["block1_conv1", "block1_conv2"]
    assert [l.name for l in vgg.layers][-3:] == ["fc1", "fc2", "predictions"]
    assert [l.coarse for l in vgg.layers].count("conv") == 16
    resnet = resolve_profile("resnet50")
    order = [l.name for l in resnet.layers]
    assert order[0] == "conv1" and order[-1] == "fc1000"
    data = json.loads((profiles_dir() / "ResNet50_gpu_bs32.dag").read_text())
    position = {name: i for i, name in enumerate(order)}
    for layer in data["layers"].values():  # every input comes before the layer it feeds
        for source in layer["input_layers"]:
            assert position[data["layers"][str(source)]["extras"]["name"]] < position[layer["extras"]["name"]]


def test_index_numbering_does_not_matter():
    # VGG16_gpu_bs64.dag numbers layers from the input, bs32 from the output.
    assert [l.name for l in resolve_profile("vgg16", 64).layers] == [l.name for l in resolve_profile("vgg16").layers]


def test_ranking_from_profile_and_coarse_types():
    ranking = resolve_profile("resnet50").ranking()
    assert len(ranking) == 107 and ranking[-1].module_type == "Dense"
    assert {coarse_type(t) for t in ("Conv2D", "Conv2d", "BatchNormalization", "BatchNorm2d",
                                     "Dense", "Linear", "ReLU")} == {"conv", "bn", "dense", "other"}


def test_alexnet_is_derived_and_labelled():
    profile = resolve_profile("alexnet")
    assert profile.derived and "DERIVED" in profile.note
    assert [l.name for l in profile.layers] == ["conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8"]
    assert profile.param_bytes / 4 == 61_100_840  # torchvision AlexNet's parameter count
    assert all(l.backward_ns > l.forward_ns > 0 for l in profile.layers)
    assert alexnet_profile(64).forward_ns > profile.forward_ns
    assert set(PROFILE_NAMES) == {"vgg16", "vgg19", "resnet50", "inceptionv3", "alexnet"}


def _tiny():
    layer = {"forward_pass_units": 10, "backward_pass_units": 20, "communication_units": 400,
             "input_layers": [], "output_layers": [], "extras": {"name": "x", "type": "Dense"}}
    first, second = copy.deepcopy(layer), copy.deepcopy(layer)
    first.update(output_layers=[1], extras={"name": "conv", "type": "Conv2D"})
    second.update(input_layers=[0], extras={"name": "fc", "type": "Dense"})
    return {"extras": {"$local$forward_pass_unit": "ns", "$local$backward_pass_unit": "ns",
                       "$local$comm_unit": "B"}, "layers": {"0": first, "1": second}}


def test_tiny_profile_parses():
    profile = parse_profile(_tiny())
    assert [l.name for l in profile.layers] == ["conv", "fc"] and profile.param_bytes == 800


@pytest.mark.parametrize("breakage, message", [
    (lambda d: d.pop("layers"), "layers"),
    (lambda d: d["extras"].update({"$local$forward_pass_unit": "ms"}), "forward_pass_unit"),
    (lambda d: d["layers"]["0"].pop("backward_pass_units"), "lacks backward_pass_units"),
    (lambda d: d["layers"]["1"].update(forward_pass_units=-1), "non-negative"),
    (lambda d: d["layers"]["1"].update(forward_pass_units="fast"), "non-negative"),
    (lambda d: d["layers"]["1"].update(input_layers=[7]), "does not exist"),
    (lambda d: d["layers"]["1"].update(input_layers=[]), "does not list"),
    (lambda d: d["layers"].update({"2": dict(d["layers"]["1"], extras={"name": "aux", "type": "Dense"})})
     or d["layers"]["0"].update(output_layers=[1, 2]), "exactly one output"),
    (lambda d: d["layers"].update({"x": d["layers"].pop("1")}), "not a non-negative integer"),
    (lambda d: d["layers"]["1"]["extras"].pop("type"), "name' and 'type'"),
    (lambda d: d["layers"]["0"].update(input_layers=[1], output_layers=[1]), "output"),
])
def test_bad_profiles_name_what_is_wrong(breakage, message):
    data = _tiny()
    breakage(data)
    with pytest.raises(ProfileError, match=message):
        parse_profile(data, source="bad.dag")


def test_cycle_is_reported():
    data = _tiny()
    extra = copy.deepcopy(data["layers"]["1"])
    extra.update(input_layers=[1], output_layers=[1], extras={"name": "loop", "type": "Dense"})
    data["layers"]["2"] = extra
    data["layers"]["1"]["input_layers"] = [0, 2]
    data["layers"]["1"]["output_layers"] = [2]
    data["layers"]["0"]["output_layers"] = [1]
    with pytest.raises(ProfileError):
        parse_profile(data)


def test_files_that_are_not_profiles(tmp_path):
    (tmp_path / "junk.dag").write_text("not json")
    with pytest.raises(ProfileError, match="not a JSON file"):
        load_profile(tmp_path / "junk.dag")
    (tmp_path / "list.dag").write_text("[1, 2]")
    with pytest.raises(ProfileError, match="not a JSON object"):
        load_profile(tmp_path / "list.dag")
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "missing.dag")
    assert issubclass(ProfileError, ConfigError)
    with pytest.raises(ProfileError, match="unknown profile"):
        resolve_profile("lenet")


def test_profile_directory_override(tmp_path, monkeypatch):
    (tmp_path / "VGG19_gpu_bs32.dag").write_text(json.dumps(_tiny()))
    monkeypatch.setenv("GERYON_PROFILES", str(tmp_path))
    assert [l.name for l in resolve_profile("vgg19").layers] == ["conv", "fc"]
    with pytest.raises(ProfileError, match="no profile"):
        resolve_profile("resnet50")
