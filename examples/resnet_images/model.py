"""The consumer's model file: a small ResNet with BatchNorm for 32x32x3 images.

dk hashes this file's exact bytes into the job (``model.source_sha256``); the worker and the
verifier each run their own copy, never anything from a bundle.
"""

import torch
from torch import nn


class Block(nn.Module):
    """A basic residual block: conv-BN-ReLU-conv-BN plus a (projected) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + (x if self.proj is None else self.proj(x)))


class ResNet(nn.Module):
    """Stem, one block per stage (widths w, 2w, 4w), global average pool, linear head."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.block0 = Block(width, width, 1)
        self.block1 = Block(width, 2 * width, 2)
        self.block2 = Block(2 * width, 4 * width, 2)
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.block1(self.block0(self.stem(x))))
        return self.head(x.mean(dim=(2, 3)))


def build(width: int = 16, classes: int = 10) -> nn.Module:
    """The factory the job names (``model.factory = "build"``)."""
    return ResNet(width, classes)
