"""Built-in small CNNs for 32x32 RGB inputs (no torchvision): to look at, test and train on CPU.

- `smallcnn`: conv-bn-relu x2, pooling, two fully-connected layers (~0.3 M parameters).
- `minivgg`: VGG-style stacks of 3x3 convolutions and three fully-connected layers, the FC layers
  holding most of the parameters (as in VGG-19).
- `miniresnet`: a ResNet-style network (stem, three stages of two basic blocks with shortcut
  projections, global pooling, one FC layer), the FC layer being a small share of the parameters.
`build_model(name)` returns (model, sample_input) with a batch of 2 images.
"""

from geryon.categorize.profiles import model_key
from geryon.errors import ConfigError

ZOO_NAMES = ("smallcnn", "minivgg", "miniresnet")


def _small_cnn(nn):
    class SmallCNN(nn.Module):
        def __init__(self, classes: int = 10):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32)
            self.conv2, self.bn2 = nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64)
            self.pool = nn.MaxPool2d(2)
            self.fc1, self.fc2 = nn.Linear(64 * 8 * 8, 64), nn.Linear(64, classes)

        def forward(self, x):
            x = self.pool(self.bn1(self.conv1(x)).relu())
            x = self.pool(self.bn2(self.conv2(x)).relu())
            return self.fc2(self.fc1(x.flatten(1)).relu())

    return SmallCNN()


def _mini_vgg(nn):
    def stack(cin, cout, convs):
        layers = []
        for i in range(convs):
            layers += [nn.Conv2d(cin if i == 0 else cout, cout, 3, padding=1), nn.ReLU()]
        return layers + [nn.MaxPool2d(2)]

    features = nn.Sequential(*stack(3, 32, 2), *stack(32, 64, 2), *stack(64, 128, 3))
    classifier = nn.Sequential(nn.Flatten(), nn.Linear(128 * 4 * 4, 512), nn.ReLU(),
                               nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    return nn.Sequential(features, classifier)


def _mini_resnet(nn):
    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.shortcut = nn.Sequential()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = self.bn1(self.conv1(x)).relu()
            return (self.bn2(self.conv2(out)) + self.shortcut(x)).relu()

    class MiniResNet(nn.Module):
        def __init__(self, classes: int = 10):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
            blocks, cin = [], 16
            for cout, stride in ((16, 1), (32, 2), (64, 2)):
                blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
                cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(64, classes)

        def forward(self, x):
            x = self.blocks(self.stem(x))
            return self.fc(x.mean(dim=(2, 3)))

    return MiniResNet()


def build_model(name: str):
    """(model, sample_input) for a built-in model name."""
    import torch
    from torch import nn

    builders = {"smallcnn": _small_cnn, "minivgg": _mini_vgg, "miniresnet": _mini_resnet}
    key = model_key(name)
    if key not in builders:
        raise ConfigError(f"unknown built-in model {name!r}; known: {', '.join(ZOO_NAMES)}")
    generator = torch.Generator().manual_seed(0)
    return builders[key](nn), torch.randn(2, 3, 32, 32, generator=generator)
