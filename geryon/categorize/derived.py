"""Profiles derived from layer FLOPs, for models with no published per-layer measurement (AlexNet).

DERIVED, NOT MEASURED. Assumptions, all stated so a reader can redo them:
- Architecture: single-tower AlexNet as in torchvision (224x224x3 input; conv 64/192/384/256/256,
  fc 9216-4096-4096-1000), 61.1 M float32 parameters.
- Forward time of a layer = its multiply-accumulates (MACs) x batch / throughput, where the
  throughput is calibrated per layer kind on the measured VGG-19 profile of the same batch size
  (same GPU, same framework): conv layers at VGG-19's conv MACs per ns, dense layers at VGG-19's
  dense MACs per ns. VGG-19's conv MACs come from its known shapes (block b runs at 224/2^(b-1)
  pixels square; MACs = pixels x (parameters − biases)); dense MACs = weights.
- Backward time = forward time x VGG-19's backward/forward ratio for the same layer kind.
- Pooling, ReLU, LRN and dropout cost nothing (VGG-19's profile has no parameter-free layers either).
"""

from geryon.categorize.profiles import LayerProfile, ProfileLayer, resolve_profile

# (name, type, output pixels per side, input channels, output channels, kernel side) for convs;
# (name, "Dense", None, inputs, outputs, None) for fully-connected layers.
ALEXNET_LAYERS = (
    ("conv1", "Conv2D", 55, 3, 64, 11),
    ("conv2", "Conv2D", 27, 64, 192, 5),
    ("conv3", "Conv2D", 13, 192, 384, 3),
    ("conv4", "Conv2D", 13, 384, 256, 3),
    ("conv5", "Conv2D", 13, 256, 256, 3),
    ("fc6", "Dense", None, 256 * 6 * 6, 4096, None),
    ("fc7", "Dense", None, 4096, 4096, None),
    ("fc8", "Dense", None, 4096, 1000, None),
)


def _vgg_macs(layer) -> float:
    """MACs per image of one VGG layer from its name and parameter bytes."""
    params = layer.param_bytes // 4
    if layer.coarse == "dense":
        return float(params)  # weights dominate; biases are negligible
    block = int(layer.name.split("_")[0].removeprefix("block"))
    out_channels = min(64 * 2 ** (block - 1), 512)
    side = 224 // 2 ** (block - 1)
    return float(side * side * (params - out_channels))


def calibration(batch: int = 32) -> dict[str, tuple[float, float]]:
    """Per kind (conv, dense): (MACs per ns for one image-batch, backward/forward ratio) from VGG-19."""
    vgg = resolve_profile("vgg19", batch=batch)
    result = {}
    for kind in ("conv", "dense"):
        layers = [layer for layer in vgg.layers if layer.coarse == kind]
        macs = sum(_vgg_macs(layer) for layer in layers) * batch
        forward = sum(layer.forward_ns for layer in layers)
        backward = sum(layer.backward_ns for layer in layers)
        result[kind] = (macs / forward, backward / forward)
    return result


def alexnet_profile(batch: int = 32) -> LayerProfile:
    """AlexNet's per-layer profile, derived from FLOPs and calibrated on VGG-19 (see module doc)."""
    rates = calibration(batch)
    layers = []
    for name, kind, side, cin, cout, k in ALEXNET_LAYERS:
        if kind == "Conv2D":
            params = k * k * cin * cout + cout
            macs = side * side * k * k * cin * cout
            rate, ratio = rates["conv"]
        else:
            params = cin * cout + cout
            macs = cin * cout
            rate, ratio = rates["dense"]
        forward = macs * batch / rate
        layers.append(ProfileLayer(name=name, type=kind, forward_ns=forward, backward_ns=forward * ratio,
                                   param_bytes=4 * params))
    return LayerProfile(model="alexnet", batch=batch, source="derived:vgg19-calibrated-flops",
                        layers=tuple(layers), derived=True,
                        note="DERIVED from layer FLOPs, calibrated on the measured VGG-19 profile "
                             "(geryon/categorize/derived.py); not a measurement")
