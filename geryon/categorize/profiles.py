"""Per-layer compute profiles (`.dag` files): parse, validate, and order layers as the forward pass.

A profile is one JSON object (format in `profiles_data/README.md`): `extras` with the units
(`$local$forward_pass_unit` and `$local$backward_pass_unit` = "ns", `$local$comm_unit` = "B") and
`layers`, a map from a string index to forward/backward time, parameter bytes, `input_layers`,
`output_layers` and `extras.name`/`extras.type`. Anything else raises `ProfileError` naming the file
and the field.

Forward order: the layer with no `output_layers` is the output; the forward order is the post-order
of a depth-first walk from it along `input_layers`, visiting inputs in the order the file lists them
(so branches are ordered deterministically and every rank reading the same file gets the same
order). Index numbers carry no meaning: in the published files index 0 is usually the output, but
`VGG16_gpu_bs64.dag` numbers from the input.

Names: `vgg16`, `vgg19`, `resnet50`, `inceptionv3` resolve to `<Model>_gpu_bs<N>.dag` under the
profile directory: the one named by the environment variable geryon.envvars.PROFILES when set,
else the profiles shipped in this package (`profiles_data/`, with their source and licence noted);
`alexnet` is derived from layer FLOPs (see `derived.py`) and labelled as such.
"""

import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from geryon import envvars
from geryon.categorize.urgency import RankedParameter
from geryon.errors import ProfileError

PACKAGED_DIR = "profiles_data"
UNITS = {"$local$forward_pass_unit": "ns", "$local$backward_pass_unit": "ns", "$local$comm_unit": "B"}
LAYER_KEYS = ("forward_pass_units", "backward_pass_units", "communication_units",
              "input_layers", "output_layers", "extras")
PROFILE_FILES = {"vgg16": "VGG16", "vgg19": "VGG19", "resnet50": "ResNet50", "inceptionv3": "InceptionV3"}
PROFILE_NAMES = tuple(PROFILE_FILES) + ("alexnet",)
BYTES_PER_PARAMETER = 4  # the profiles are float32


@dataclass(frozen=True)
class ProfileLayer:
    """One layer of a profile, with its compute times and parameter bytes."""

    name: str
    type: str          # as in the file: "Conv2D", "BatchNormalization", "Dense", ...
    forward_ns: float
    backward_ns: float
    param_bytes: int

    @property
    def coarse(self) -> str:
        """conv, bn, dense or other: the granularity the coarse categorization works on."""
        return coarse_type(self.type)


@dataclass(frozen=True)
class LayerProfile:
    """A model as a list of layers in forward order (index 0 runs first)."""

    model: str
    batch: int | None
    source: str
    layers: tuple[ProfileLayer, ...]
    derived: bool = False  # True: computed, not measured (see `note`)
    note: str = ""
    extras: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def forward_ns(self) -> float:
        return sum(layer.forward_ns for layer in self.layers)

    @property
    def backward_ns(self) -> float:
        return sum(layer.backward_ns for layer in self.layers)

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    def ranking(self) -> list[RankedParameter]:
        """The urgency ranking: one tensor per layer that has parameters, in forward order."""
        return [RankedParameter(name=layer.name, layer=layer.name, module_type=layer.type,
                                numel=layer.param_bytes // BYTES_PER_PARAMETER, bytes=layer.param_bytes)
                for layer in self.layers if layer.param_bytes > 0]


def coarse_type(type_name: str) -> str:
    """Map a layer or module type name (Keras or torch) to conv / bn / dense / other."""
    lowered = type_name.lower()
    if lowered.startswith("conv"):
        return "conv"
    if "batchnorm" in lowered or "batch_norm" in lowered or lowered.startswith("bn"):
        return "bn"
    if lowered in ("dense", "linear", "lazylinear", "nonDynamicallyQuantizableLinear".lower()):
        return "dense"
    return "other"


def load_profile(path) -> LayerProfile:
    """Read and validate a `.dag` profile; raise ProfileError naming what is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"profile {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"profile {path} is not a JSON file: {exc}") from None
    return parse_profile(data, source=str(path))


def parse_profile(data, source: str = "<profile>") -> LayerProfile:
    """Validate a decoded profile object and return its layers in forward order."""
    def fail(what):
        raise ProfileError(f"profile {source}: {what} (format: geryon/categorize/profiles_data/README.md)")

    if not isinstance(data, dict):
        fail("top level is not a JSON object")
    extras, layers = data.get("extras"), data.get("layers")
    if not isinstance(extras, dict):
        fail("missing object 'extras'")
    for key, unit in UNITS.items():
        if extras.get(key) != unit:
            fail(f"extras.{key} is {extras.get(key)!r}, expected {unit!r}")
    if not isinstance(layers, dict) or not layers:
        fail("missing or empty object 'layers'")
    for key in layers:
        if not (isinstance(key, str) and key.isdigit()):
            fail(f"layer key {key!r} is not a non-negative integer")
    raw = {}
    for key, layer in layers.items():
        if not isinstance(layer, dict):
            fail(f"layer {key} is not an object")
        missing = [k for k in LAYER_KEYS if k not in layer]
        if missing:
            fail(f"layer {key} lacks {', '.join(missing)}")
        for k in ("forward_pass_units", "backward_pass_units", "communication_units"):
            value = layer[k]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                fail(f"layer {key}.{k} is {value!r}, expected a non-negative number")
        for k in ("input_layers", "output_layers"):
            links = layer[k]
            if not isinstance(links, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                      for i in links):
                fail(f"layer {key}.{k} is not a list of layer indices")
            for i in links:
                if str(i) not in layers:
                    fail(f"layer {key}.{k} names layer {i}, which does not exist")
        names = layer["extras"]
        if not isinstance(names, dict) or not isinstance(names.get("name"), str) \
                or not isinstance(names.get("type"), str):
            fail(f"layer {key}.extras needs string 'name' and 'type'")
        raw[int(key)] = layer
    for index, layer in raw.items():
        for i in layer["input_layers"]:
            if index not in raw[i]["output_layers"]:
                fail(f"layer {index} lists input {i}, but layer {i} does not list {index} as output")
        for o in layer["output_layers"]:
            if index not in raw[o]["input_layers"]:
                fail(f"layer {index} lists output {o}, but layer {o} does not list {index} as input")
    outputs = sorted(i for i, layer in raw.items() if not layer["output_layers"])
    if len(outputs) != 1:
        fail(f"expected exactly one output layer (no output_layers), found {outputs}")
    order = _forward_order(raw, outputs[0], fail)
    if len(order) != len(raw):
        unreachable = sorted(set(raw) - set(order))
        fail(f"layers {unreachable[:5]} are not connected to the output layer")
    names_seen = {}
    for i in order:
        name = raw[i]["extras"]["name"]
        if name in names_seen:
            fail(f"layer name {name!r} is used by layers {names_seen[name]} and {i}")
        names_seen[name] = i
    profile_layers = tuple(
        ProfileLayer(name=raw[i]["extras"]["name"], type=raw[i]["extras"]["type"],
                     forward_ns=float(raw[i]["forward_pass_units"]),
                     backward_ns=float(raw[i]["backward_pass_units"]),
                     param_bytes=int(raw[i]["communication_units"]))
        for i in order)
    args = extras.get("$local$profile_info", {}).get("args", {}) if isinstance(
        extras.get("$local$profile_info"), dict) else {}
    batch = args.get("batch_size") if isinstance(args.get("batch_size"), int) else None
    return LayerProfile(model=str(extras.get("name", Path(source).stem)), batch=batch, source=source,
                        layers=profile_layers, extras=extras)


def _forward_order(raw: dict, output: int, fail) -> list[int]:
    """Post-order of a depth-first walk from the output along input_layers (iterative, cycle-checked)."""
    order, done, on_path = [], set(), set()
    stack = [(output, iter(raw[output]["input_layers"]))]
    on_path.add(output)
    while stack:
        node, inputs = stack[-1]
        for nxt in inputs:
            if nxt in on_path:
                fail(f"layers form a cycle through layer {nxt}")
            if nxt not in done:
                on_path.add(nxt)
                stack.append((nxt, iter(raw[nxt]["input_layers"])))
                break
        else:
            stack.pop()
            on_path.discard(node)
            done.add(node)
            order.append(node)
    return order


def profiles_dir() -> Path:
    """Where named profiles live: the directory in envvars.PROFILES, else the packaged ones."""
    env = os.environ.get(envvars.PROFILES)
    if env:
        return Path(env)
    return Path(str(resources.files("geryon.categorize") / PACKAGED_DIR))


def model_key(name: str) -> str:
    """A model name as looked up (built-in CNNs and named profiles): lower case, no '-' or '_'."""
    return name.lower().replace("-", "").replace("_", "")


def resolve_profile(name: str, batch: int = 32) -> LayerProfile:
    """Load a profile by model name (vgg16, vgg19, resnet50, inceptionv3, alexnet) or by file path."""
    key = model_key(name)
    if key == "alexnet":
        from geryon.categorize.derived import alexnet_profile
        return alexnet_profile(batch=batch)
    if key in PROFILE_FILES:
        path = profiles_dir() / f"{PROFILE_FILES[key]}_gpu_bs{batch}.dag"
        if not path.exists():
            raise ProfileError(f"no profile {path} (batch sizes in the directory: see its README; "
                               f"set {envvars.PROFILES} to another directory)")
        return load_profile(path)
    if name.endswith(".dag") or os.sep in name:
        return load_profile(name)
    raise ProfileError(f"unknown profile {name!r}; known: {', '.join(PROFILE_NAMES)} or a path to a .dag file")
