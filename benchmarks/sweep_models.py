"""Tiny models of every transformers architecture: shrunken default configs and inputs.

A default config describes a full-size model (often billions of parameters). ``shrink_config``
walks its attributes and sub-configs and makes every size small (hidden 32, 2 heads, 2 layers,
vocabulary 256, images of 32 pixels), keeping the relations models check: hidden sizes divisible
by head counts, key/value heads dividing query heads, per-layer lists as long as the layer count,
special token ids inside the vocabulary. ``input_candidates`` proposes inputs from the model's
``main_input_name`` and its forward signature, smallest set first; the sweep keeps the first that
eager runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

HIDDEN = 32
HEADS = 2
LAYERS = 2
VOCAB = 256
IMAGE = 32
BATCH = 2
SEQ = 8

# name -> small value, for integer attributes found anywhere in a config.
_SIZES = {
    "hidden_size": HIDDEN, "d_model": HIDDEN, "n_embd": HIDDEN, "embed_dim": HIDDEN, "dim": HIDDEN,
    "embedding_size": HIDDEN, "word_embed_proj_dim": HIDDEN, "projection_dim": HIDDEN, "text_embed_dim": HIDDEN,
    "vision_embed_dim": HIDDEN, "projection_size": HIDDEN, "proj_dim": HIDDEN, "hidden_dim": HIDDEN,
    "intermediate_size": 2 * HIDDEN, "ffn_dim": 2 * HIDDEN, "encoder_ffn_dim": 2 * HIDDEN,
    "decoder_ffn_dim": 2 * HIDDEN, "d_ff": 2 * HIDDEN, "n_inner": 2 * HIDDEN, "mlp_dim": 2 * HIDDEN,
    "moe_intermediate_size": HIDDEN, "shared_expert_intermediate_size": HIDDEN,
    "num_attention_heads": HEADS, "n_head": HEADS, "num_heads": HEADS, "encoder_attention_heads": HEADS,
    "decoder_attention_heads": HEADS, "num_decoder_attention_heads": HEADS, "n_heads": HEADS,
    "num_hidden_layers": LAYERS, "num_layers": LAYERS, "n_layer": LAYERS, "n_layers": LAYERS,
    "encoder_layers": LAYERS, "decoder_layers": LAYERS, "num_decoder_layers": LAYERS,
    "num_encoder_layers": LAYERS, "depth": LAYERS,
    "vocab_size": VOCAB, "image_size": IMAGE, "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4,
    "num_experts_per_tok": 2, "moe_topk": 2, "top_k": 2, "d_kv": HIDDEN // HEADS, "head_dim": HIDDEN // HEADS,
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "qk_head_dim": 16,
}
_KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
# Per-layer lists whose length must equal the layer count.
_PER_LAYER_HINTS = ("layer_types", "layers_block_type", "block_types", "attn_layer", "sliding_window_pattern_list")


@dataclass
class ShrinkReport:
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)


def _is_config(value: Any) -> bool:
    return hasattr(value, "to_dict") and hasattr(value, "model_type")


# What a gentler shrink keeps: the widths (for models whose parts assume their default widths).
_WIDTHS = frozenset(n for n, v in _SIZES.items() if v in (HIDDEN, 2 * HIDDEN, HEADS, HIDDEN // HEADS, 16, 8)
                    and n not in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
                                  "decoder_layers", "num_decoder_layers", "num_encoder_layers", "depth"))


def shrink_config(config: Any, prefix: str = "", report: ShrinkReport | None = None,
                  widths: bool = True) -> ShrinkReport:
    """Make ``config`` (a ``PretrainedConfig``) tiny, in place, sub-configs included; with
    ``widths=False`` only layer counts, vocabulary, experts and images shrink."""
    report = report if report is not None else ShrinkReport()
    attrs = vars(config)
    old_layers = attrs.get("num_hidden_layers")
    old_heads = attrs.get("num_attention_heads")

    def set_(name: str, value: Any) -> None:
        old = attrs.get(name)
        if old != value:
            try:
                setattr(config, name, value)
            except Exception:  # some configs expose read-only properties
                return
            report.changed[prefix + name] = (old, value)

    for name, value in list(attrs.items()):
        if name.startswith("_"):
            continue
        if _is_config(value):
            shrink_config(value, prefix + name + ".", report, widths)
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int) and name in _SIZES and (widths or name not in _WIDTHS):
            set_(name, min(value, _SIZES[name]) if name not in ("vocab_size",) else min(value, VOCAB))
        elif isinstance(value, int) and name in _KV_HEADS and widths:
            heads = old_heads if isinstance(old_heads, int) else value
            set_(name, HEADS if value >= heads else 1)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                                for v in value):
            _shrink_int_list(name, list(value), set_, widths)
        elif isinstance(value, dict) and isinstance(value.get("mrope_section"), list) and widths:
            # sections of the rotary half-dimension: scaled to the tiny head size
            set_(name, {**value, "mrope_section": _sections(value["mrope_section"], HIDDEN // HEADS // 2)})
        elif isinstance(value, float) and ("drop" in name or (name.startswith("mask_") and name.endswith("_prob"))):
            set_(name, 0.0)
    # Lists that follow the layer count.
    layers = attrs.get("num_hidden_layers")
    if isinstance(old_layers, int) and isinstance(layers, int) and layers != old_layers:
        for name, value in list(attrs.items()):
            if isinstance(value, (list, tuple)) and len(value) == old_layers and (
                    any(h in name for h in _PER_LAYER_HINTS) or name.endswith("_layers") or name.endswith("_types")):
                set_(name, type(value)(value[:layers]))
    for name in ("use_cache",):
        if attrs.get(name) is True:
            set_(name, False)
    _keep_tokens_in_vocab(config, attrs, set_)
    if widths:
        _keep_heads_dividing(config, attrs, set_)
    return report


def _sections(sizes: list[int], total: int) -> list[int]:
    out = [max(1, total * s // sum(sizes)) for s in sizes]
    out[-1] += total - sum(out)
    return out


def init_arguments(config: Any) -> dict[str, Any]:
    """The arguments of the config's constructor, read back from it (sub-configs as dicts of their
    own constructor's arguments): building the config again from these re-derives every value the
    constructor computes from others (a Swin config's ``hidden_size`` from its ``embed_dim``)."""
    try:
        params = inspect.signature(type(config).__init__).parameters
    except (TypeError, ValueError):
        params = {}
    names = [n for n, p in params.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    out: dict[str, Any] = {}
    for name in names:
        if not hasattr(config, name):
            continue
        value = getattr(config, name)
        if _is_config(value):
            value = {"model_type": value.model_type, **init_arguments(value)}
        out[name] = value
    return out


def rebuilt(config: Any) -> Any:
    """The config constructed again from its constructor's arguments; itself if that fails."""
    try:
        fresh = type(config)(**init_arguments(config))
    except Exception:
        return config
    return fresh


def _shrink_int_list(name: str, value: list[int], set_, widths: bool) -> None:
    """Per-stage lists of vision backbones (depths, hidden sizes, heads per stage)."""
    if name in ("depths", "num_layers_per_stage") or name.endswith("depths"):
        set_(name, [1] * len(value))
    elif not widths:
        return
    elif name in ("hidden_sizes", "embed_dims", "dims", "embed_dim", "hidden_dims", "channels", "widths"):
        set_(name, [16 * (i + 1) for i in range(len(value))])
    elif name in ("num_heads", "num_attention_heads", "heads"):
        set_(name, [1] * len(value))


def _keep_tokens_in_vocab(config: Any, attrs: dict, set_) -> None:
    vocab = attrs.get("vocab_size")
    if not isinstance(vocab, int):
        return
    taken = {v for k, v in attrs.items() if isinstance(v, int) and _is_token_id(k) and v < vocab}
    spare = (v for v in range(vocab - 1, 0, -1) if v not in taken)
    for name, value in list(attrs.items()):
        if _is_token_id(name) and isinstance(value, int) and not isinstance(value, bool) and value >= vocab:
            set_(name, next(spare, 0))  # a vocabulary too small for distinct ids: share id 0
        elif _is_token_id(name) and isinstance(value, list):
            set_(name, [v if not isinstance(v, int) or v < vocab else next(spare, 0) for v in value])


def _is_token_id(name: str) -> bool:
    return name.endswith("_token_id") or name.endswith("_token_index") or name.endswith("_token_ids") or \
        name in ("image_token_id", "video_token_id", "audio_token_id", "decoder_start_token_id")


def _keep_heads_dividing(config: Any, attrs: dict, set_) -> None:
    hidden = attrs.get("hidden_size")
    heads = attrs.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads and hidden % heads:
        set_("num_attention_heads", 1)


def special_token_ids(config: Any) -> set[int]:
    """Every token id a config names, sub-configs included: random text avoids them."""
    out: set[int] = set()
    for name, value in vars(config).items():
        if _is_config(value):
            out |= special_token_ids(value)
        elif _is_token_id(name) and isinstance(value, int) and not isinstance(value, bool):
            out.add(value)
    return out


def _first(config: Any, names: tuple[str, ...], default: Any, subs: tuple[str, ...] = ()) -> Any:
    for sub in (None, *subs):
        try:
            c = config if sub is None else getattr(config, sub, None)
        except Exception:  # a sub-config built on access that does not validate at the tiny sizes
            c = None
        if c is None:
            continue
        for name in names:
            value = getattr(c, name, None)
            if value is not None and not isinstance(value, bool):
                return value
    return default


_VISION_SUBS = ("vision_config", "backbone_config", "encoder_config", "image_config")
_TEXT_SUBS = ("text_config", "decoder_config", "language_config", "llm_config")
_AUDIO_SUBS = ("audio_config", "encoder_config", "speech_config")


def _token_ids(config: Any, generator: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    vocab = _first(config, ("vocab_size",), VOCAB, _TEXT_SUBS)
    vocab = vocab if isinstance(vocab, int) and vocab > 8 else VOCAB
    avoid = special_token_ids(config)
    ids = torch.randint(3, max(4, vocab - 2), shape, generator=generator)
    for token in avoid:  # move specials to an ordinary id
        ids[ids == token] = 3 if 3 not in avoid else 4
    return ids


def _pixels(config: Any, generator: torch.Generator) -> torch.Tensor:
    side = _first(config, ("image_size", "img_size", "input_size"), IMAGE, _VISION_SUBS)
    if isinstance(side, (list, tuple)):
        side = side[-1]
    channels = _first(config, ("num_channels", "in_channels", "in_chans", "input_channels"), 3, _VISION_SUBS)
    side = side if isinstance(side, int) else IMAGE
    channels = channels if isinstance(channels, int) else 3
    return torch.randn(BATCH, channels, side, side, generator=generator)


def _audio_features(config: Any, generator: torch.Generator, channels_first: bool) -> torch.Tensor:
    bins = _first(config, ("num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels"), 80, _AUDIO_SUBS)
    positions = _first(config, ("max_source_positions",), None, _AUDIO_SUBS)
    frames = _first(config, ("max_length",), 64, _AUDIO_SUBS)
    frames = 2 * positions if isinstance(positions, int) and positions <= 1500 else frames
    frames = frames if isinstance(frames, int) and frames <= 4096 else 64
    shape = (BATCH, bins, frames) if channels_first else (BATCH, frames, bins)
    return torch.randn(*shape, generator=generator)


# Parameter name -> how to make it (config, generator) -> value.
def _fillers() -> dict[str, Any]:
    return {
        "input_ids": lambda c, g: _token_ids(c, g, (BATCH, SEQ)),
        "decoder_input_ids": lambda c, g: _token_ids(c, g, (BATCH, SEQ)),
        "attention_mask": lambda c, g: torch.ones(BATCH, SEQ, dtype=torch.long),
        "token_type_ids": lambda c, g: torch.zeros(BATCH, SEQ, dtype=torch.long),
        "pixel_values": lambda c, g: _pixels(c, g),
        "input_values": lambda c, g: torch.randn(BATCH, 4000, generator=g),
        "input_features": lambda c, g: _audio_features(c, g, True),
        "bbox": lambda c, g: _boxes(g),
        "inputs_embeds": lambda c, g: torch.randn(BATCH, SEQ, _first(c, ("hidden_size", "d_model"), HIDDEN,
                                                                    _TEXT_SUBS), generator=g),
        "past_values": lambda c, g: torch.randn(BATCH, _first(c, ("context_length",), 32) or 32,
                                                _first(c, ("num_input_channels",), 1) or 1, generator=g),
    }


def _boxes(generator: torch.Generator) -> torch.Tensor:
    a = torch.randint(0, 500, (BATCH, SEQ, 2), generator=generator)
    b = a + torch.randint(0, 500, (BATCH, SEQ, 2), generator=generator)
    return torch.cat([a, b], -1)


@dataclass
class InputCandidate:
    kwargs: dict[str, Any]
    note: str


def input_candidates(model: torch.nn.Module, config: Any, seed: int = 0) -> Iterator[InputCandidate]:
    """Inputs to try, smallest first: the main input and the required parameters, then with a
    decoder input, pixels, a mask, and the other layout of audio features."""
    fillers = _fillers()
    main = getattr(model, "main_input_name", "input_ids")
    mains = list(main) if isinstance(main, (list, tuple)) else [main]  # OneFormer names two
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    extras: list[tuple[str, ...]] = [()]
    for optional in (("decoder_input_ids",), ("pixel_values",), ("attention_mask",),
                     ("pixel_values", "decoder_input_ids"), ("input_ids", "pixel_values"), ("bbox",)):
        if all(name in params for name in optional):
            extras.append(optional)
    seen: set[tuple[str, ...]] = set()
    for extra in extras:
        names = tuple(dict.fromkeys([*mains, *required, *extra]))
        if names in seen:
            continue
        seen.add(names)
        missing = [n for n in names if n not in fillers]
        if missing:
            continue
        two_layouts = "input_features" in names or "input_values" in names
        for layout in ((True, False) if two_layouts else (True,)):
            generator = torch.Generator().manual_seed(seed)
            kwargs = {}
            for name in names:
                if name == "input_features" or (name == "input_values" and not layout):
                    kwargs[name] = _audio_features(config, generator, layout)
                else:
                    kwargs[name] = fillers[name](config, generator)
            note = ", ".join(names) + ("" if layout else " (frames first)")
            yield InputCandidate(kwargs, note)


def unfillable(model: torch.nn.Module) -> list[str]:
    """Required forward parameters the sweep has no recipe for."""
    fillers = _fillers()
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return []
    return [n for n, p in params.items() if p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in fillers]
