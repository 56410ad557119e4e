"""ResNet18 baseline for CIFAR-10 (He et al. 2016, the variant used by the paper's Figure 5).

The CIFAR variant replaces ImageNet's 7x7/2 stem and max-pool with one 3x3/1 convolution, so the 32x32 image keeps
its resolution into the first stage. Built from torchvision's own ``BasicBlock`` so the blocks are the reference
ones; the stem is the only difference. ``width`` scales every stage (64 = He et al.; smaller only for smoke runs).
"""

from __future__ import annotations

from torch import Tensor, nn
from torchvision.models.resnet import BasicBlock


def _stage(in_planes: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
    downsample = None
    if stride != 1 or in_planes != planes:
        downsample = nn.Sequential(
            nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes)
        )
    layers = [BasicBlock(in_planes, planes, stride, downsample)]
    layers += [BasicBlock(planes, planes) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


class ResNet18(nn.Module):
    """ResNet18 with a 3x3 stride-1 stem and no max-pool (11,173,962 parameters at width 64, 10 classes)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 64) -> None:
        super().__init__()
        widths = [width, 2 * width, 4 * width, 8 * width]
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        self.stages = nn.Sequential(
            _stage(widths[0], widths[0], 2, stride=1),
            _stage(widths[0], widths[1], 2, stride=2),
            _stage(widths[1], widths[2], 2, stride=2),
            _stage(widths[2], widths[3], 2, stride=2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(widths[3], num_classes)
        for module in self.modules():  # torchvision's ResNet initialisation
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: Tensor) -> Tensor:  # (B, C, H, W) -> (B, num_classes)
        return self.classifier(self.pool(self.stages(self.stem(images))).flatten(1))

    def no_weight_decay(self) -> set[str]:
        return set()
