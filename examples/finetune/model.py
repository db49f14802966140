"""The consumer's model file: a small MLP with LayerNorm for 8x8 digit images."""

from torch import nn


def build(hidden: int = 64, classes: int = 10) -> nn.Module:
    """The factory the job names; its weights come from ``init.safetensors``."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, hidden),
        nn.LayerNorm(hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )
