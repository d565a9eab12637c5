"""torchvision and timm models, built with random weights, when those libraries are importable.

Neither library is a dependency of the harness: without it these models are reported as
unavailable (the GPU machines have them; the CI machine does not).
"""

from __future__ import annotations

import importlib

import torch

from benchmarks.models.spec import BuiltModel, Inputs, ModelSpec

# preset -> (batch, image side)
_IMAGE = {"small": (2, 64), "medium": (4, 128), "large": (32, 224)}


def _images(preset: str):
    batch, side = _IMAGE[preset]

    def inputs(seed: int, tiny: bool) -> Inputs:
        generator = torch.Generator().manual_seed(seed)
        return Inputs((torch.randn(1 if tiny else batch, 3, side, side, generator=generator),))

    return inputs


def _torchvision(name: str):
    def build(preset: str) -> BuiltModel:
        models = importlib.import_module("torchvision.models")
        return BuiltModel(getattr(models, name)(weights=None, num_classes=100), _images(preset))

    return build


def _timm(name: str):
    def build(preset: str) -> BuiltModel:
        timm = importlib.import_module("timm")
        # pretrained=False: timm never touches the network for a randomly initialised model.
        model = timm.create_model(name, pretrained=False, num_classes=100, drop_rate=0.0, drop_path_rate=0.0,
                                  **({"img_size": _IMAGE[preset][1]} if "vit" in name else {}))
        return BuiltModel(model, _images(preset))

    return build


MODELS = [
    ModelSpec("tv_resnet18", "torchvision", _torchvision("resnet18"), requires=("torchvision",)),
    ModelSpec("tv_mobilenet_v3_small", "torchvision", _torchvision("mobilenet_v3_small"),
              requires=("torchvision",)),
    ModelSpec("tv_efficientnet_b0", "torchvision", _torchvision("efficientnet_b0"), requires=("torchvision",)),
    ModelSpec("timm_vit_tiny", "timm", _timm("vit_tiny_patch16_224"), requires=("timm",)),
    ModelSpec("timm_resnet50", "timm", _timm("resnet50"), requires=("timm",)),
]
