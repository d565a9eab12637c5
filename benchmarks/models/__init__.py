"""The model suite, defined in one place.

Every model is a `ModelSpec`: a name, a family, and a `build(preset)` that returns a `BuiltModel`
(an `nn.Module` with seeded random weights on the CPU, plus a seeded input factory). Nothing is
ever downloaded: Hugging Face models are built from config objects, token ids come from
`torch.randint`.

Presets, in `PRESETS`: "small" fits the 2-core CI machine (each eager step well under a second),
"medium" (4 layers x 256 wide, batch 4 x 128 tokens, 64 px images) is sized for a CPU benchmark
where the kernels, not the per-call overhead, take most of a call, "large" is for GPUs. Every size
table of the suite (`hf.SIZES`, the per-model tables beside each build) has one entry per preset.
Suites are named lists of models; `suite_models(name)` resolves one.
"""

from __future__ import annotations

from benchmarks.models.spec import PRESETS, BuiltModel, Inputs, ModelSpec, ModelUnavailable

__all__ = ["COLD_LIMITS", "PRESETS", "SUITES", "BuiltModel", "Inputs", "ModelSpec", "ModelUnavailable",
           "all_models", "get_model", "suite_models"]


def _registry() -> dict[str, ModelSpec]:
    from benchmarks.models import handwritten, hf, zoo

    specs: dict[str, ModelSpec] = {}
    for spec in (*handwritten.MODELS, *hf.MODELS, *zoo.MODELS):
        if spec.name in specs:
            raise ValueError(f"model {spec.name!r} is defined twice in the suite")
        specs[spec.name] = spec
    return specs


_MODELS: dict[str, ModelSpec] | None = None


def all_models() -> dict[str, ModelSpec]:
    """Every model of the suite by name, in definition order."""
    global _MODELS
    if _MODELS is None:
        _MODELS = _registry()
    return _MODELS


def get_model(name: str) -> ModelSpec:
    models = all_models()
    if name not in models:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(models)}")
    return models[name]


def _family(*families: str) -> list[str]:
    return [name for name, spec in all_models().items() if spec.family in families]


# A suite is either a fixed list of names or computed from the families.
SUITES = {
    # Fast enough for the nox `bench` session on a 2-core CPU with eager and inductor.
    "quick": lambda: ["bert", "mlp", "cnn_bn", "transformer_block", "layernorm", "softmax"],
    "micro": lambda: _family("micro"),
    "handwritten": lambda: _family("hand-written", "micro"),
    "hf": lambda: _family("encoder", "decoder", "encoder-decoder", "vision", "audio"),
    "zoo": lambda: _family("torchvision", "timm"),
    # The default on CUDA: the models people bring to a GPU, not the quick smoke test.
    "gpu": lambda: [*SUITES["hf"](), *SUITES["zoo"]()],
    "all": lambda: list(all_models()),
}


# Cold compiles run in fresh processes that import torch and the compiler again: on a 2-core
# machine that is most of a minute per model and backend. A suite may cap how many of its models
# (the first ones) get that measurement by default, to keep its run short.
COLD_LIMITS = {"quick": 2}


def suite_models(suite: str) -> list[ModelSpec]:
    if suite not in SUITES:
        raise KeyError(f"unknown suite {suite!r}; known suites: {', '.join(SUITES)}")
    return [get_model(name) for name in SUITES[suite]()]
