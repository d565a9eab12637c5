"""Hugging Face transformers models, built from config objects with random weights.

Nothing is downloaded: no `from_pretrained`, no hub tokenizers; token ids come from
`torch.randint`. Every dropout-like probability (dropout, attention dropout, layer drop, drop
path, SpecAugment masking) is set to zero so that a training step is deterministic and eager can
be the oracle for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmarks.models.spec import BuiltModel, Inputs, ModelSpec


@dataclass(frozen=True)
class Sizes:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    batch: int
    seq: int
    image: int  # vision models: square image side
    audio_frames: int  # Whisper: mel frames (twice the encoder positions)


SIZES = {
    "small": Sizes(hidden=64, layers=2, heads=4, intermediate=128, vocab=512, batch=2, seq=32,
                   image=32, audio_frames=64),
    "medium": Sizes(hidden=256, layers=4, heads=4, intermediate=1024, vocab=8192, batch=4, seq=128,
                    image=64, audio_frames=256),
    "large": Sizes(hidden=768, layers=6, heads=12, intermediate=3072, vocab=32000, batch=8, seq=512,
                   image=224, audio_frames=3000),
}
TINY_SEQ = 8


def _transformers():
    import transformers

    return transformers


def _no_randomness(config) -> None:
    """Zero every probability that would make a training step random."""
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("drop" in key or key.startswith("mask_") and key.endswith("_prob")):
            setattr(config, key, 0.0)
    for sub_name in ("text_config", "vision_config", "encoder", "decoder"):
        sub = getattr(config, sub_name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            _no_randomness(sub)


def _build(class_name: str, config_name: str, **config_kwargs) -> torch.nn.Module:
    transformers = _transformers()
    config = getattr(transformers, config_name)(**config_kwargs)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    _no_randomness(config)
    return getattr(transformers, class_name)(config)


def _ids(generator: torch.Generator, vocab: int, batch: int, seq: int) -> torch.Tensor:
    # Token 0 is often padding or a special token; real text rarely is all specials.
    return torch.randint(1, vocab, (batch, seq), generator=generator)


def _text(vocab: int, sizes: Sizes, mask: bool = True, token_types: bool = False):
    def inputs(seed: int, tiny: bool) -> Inputs:
        generator = torch.Generator().manual_seed(seed)
        batch, seq = (1, TINY_SEQ) if tiny else (sizes.batch, sizes.seq)
        kwargs = {"input_ids": _ids(generator, vocab, batch, seq)}
        if mask:
            kwargs["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
        if token_types:
            kwargs["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.long)
        return Inputs(kwargs=kwargs)

    return inputs


def _seq2seq(vocab: int, sizes: Sizes):
    def inputs(seed: int, tiny: bool) -> Inputs:
        generator = torch.Generator().manual_seed(seed)
        batch, seq = (1, TINY_SEQ) if tiny else (sizes.batch, sizes.seq)
        return Inputs(kwargs={
            "input_ids": _ids(generator, vocab, batch, seq),
            "attention_mask": torch.ones(batch, seq, dtype=torch.long),
            "decoder_input_ids": _ids(generator, vocab, batch, max(seq // 2, 4)),
        })

    return inputs


def _pixels(sizes: Sizes, channels: int = 3):
    def inputs(seed: int, tiny: bool) -> Inputs:
        generator = torch.Generator().manual_seed(seed)
        batch = 1 if tiny else sizes.batch
        return Inputs(kwargs={"pixel_values": torch.randn(batch, channels, sizes.image, sizes.image,
                                                          generator=generator)})

    return inputs


def _bert_like(class_name: str, config_name: str, **extra):
    def build(preset: str) -> BuiltModel:
        s = SIZES[preset]
        model = _build(class_name, config_name, vocab_size=s.vocab, hidden_size=s.hidden,
                       num_hidden_layers=s.layers, num_attention_heads=s.heads,
                       intermediate_size=s.intermediate, max_position_embeddings=2 * s.seq + 2, **extra)
        return BuiltModel(model, _text(s.vocab, s, token_types=True))

    return build


def _distilbert(preset: str) -> BuiltModel:
    s = SIZES[preset]
    model = _build("DistilBertModel", "DistilBertConfig", vocab_size=s.vocab, dim=s.hidden, n_layers=s.layers,
                   n_heads=s.heads, hidden_dim=s.intermediate, max_position_embeddings=2 * s.seq)
    return BuiltModel(model, _text(s.vocab, s))


def _llama_like(class_name: str, config_name: str, kv_heads: int | None = None, **extra):
    def build(preset: str) -> BuiltModel:
        s = SIZES[preset]
        model = _build(class_name, config_name, vocab_size=s.vocab, hidden_size=s.hidden,
                       intermediate_size=s.intermediate, num_hidden_layers=s.layers,
                       num_attention_heads=s.heads, num_key_value_heads=kv_heads or s.heads // 2,
                       max_position_embeddings=2 * s.seq, **extra)
        return BuiltModel(model, _text(s.vocab, s))

    return build


def _gemma(preset: str) -> BuiltModel:
    s = SIZES[preset]
    return _llama_like("GemmaForCausalLM", "GemmaConfig", kv_heads=1, head_dim=s.hidden // s.heads)(preset)


def _phi(preset: str) -> BuiltModel:
    s = SIZES[preset]
    model = _build("PhiForCausalLM", "PhiConfig", vocab_size=s.vocab, hidden_size=s.hidden,
                   intermediate_size=s.intermediate, num_hidden_layers=s.layers, num_attention_heads=s.heads,
                   max_position_embeddings=2 * s.seq, partial_rotary_factor=0.5)
    return BuiltModel(model, _text(s.vocab, s))


def _gpt2(preset: str) -> BuiltModel:
    s = SIZES[preset]
    model = _build("GPT2LMHeadModel", "GPT2Config", vocab_size=s.vocab, n_positions=2 * s.seq, n_embd=s.hidden,
                   n_layer=s.layers, n_head=s.heads, n_inner=s.intermediate, bos_token_id=1, eos_token_id=2)
    return BuiltModel(model, _text(s.vocab, s))


def _gpt_neo(preset: str) -> BuiltModel:
    s = SIZES[preset]
    # Alternating global and local (windowed) attention, as in the released checkpoints.
    model = _build("GPTNeoForCausalLM", "GPTNeoConfig", vocab_size=s.vocab, max_position_embeddings=2 * s.seq,
                   hidden_size=s.hidden, num_layers=s.layers, num_heads=s.heads,
                   intermediate_size=s.intermediate, window_size=s.seq // 2,
                   attention_types=[[["global", "local"], s.layers // 2]], bos_token_id=1, eos_token_id=2)
    return BuiltModel(model, _text(s.vocab, s))


def _opt(preset: str) -> BuiltModel:
    s = SIZES[preset]
    model = _build("OPTForCausalLM", "OPTConfig", vocab_size=s.vocab, hidden_size=s.hidden,
                   num_hidden_layers=s.layers, ffn_dim=s.intermediate, num_attention_heads=s.heads,
                   max_position_embeddings=2 * s.seq, word_embed_proj_dim=s.hidden)
    return BuiltModel(model, _text(s.vocab, s))


def _t5(preset: str) -> BuiltModel:
    s = SIZES[preset]
    model = _build("T5ForConditionalGeneration", "T5Config", vocab_size=s.vocab, d_model=s.hidden,
                   d_kv=s.hidden // s.heads, d_ff=s.intermediate, num_layers=s.layers, num_heads=s.heads,
                   decoder_start_token_id=0, pad_token_id=0)
    return BuiltModel(model, _seq2seq(s.vocab, s))


def _bart_like(class_name: str, config_name: str):
    def build(preset: str) -> BuiltModel:
        s = SIZES[preset]
        model = _build(class_name, config_name, vocab_size=s.vocab, d_model=s.hidden, encoder_layers=s.layers,
                       decoder_layers=s.layers, encoder_attention_heads=s.heads, decoder_attention_heads=s.heads,
                       encoder_ffn_dim=s.intermediate, decoder_ffn_dim=s.intermediate,
                       max_position_embeddings=2 * s.seq)
        return BuiltModel(model, _seq2seq(s.vocab, s))

    return build


# Whisper's input channels: the released checkpoints have 80 mel bins; small keeps it cheap.
WHISPER_MEL_BINS = {"small": 16, "medium": 80, "large": 80}


def _whisper(preset: str) -> BuiltModel:
    s = SIZES[preset]
    mel_bins = WHISPER_MEL_BINS[preset]
    model = _build("WhisperForConditionalGeneration", "WhisperConfig", vocab_size=s.vocab, num_mel_bins=mel_bins,
                   encoder_layers=s.layers, decoder_layers=s.layers, encoder_attention_heads=s.heads,
                   decoder_attention_heads=s.heads, d_model=s.hidden, encoder_ffn_dim=s.intermediate,
                   decoder_ffn_dim=s.intermediate, max_source_positions=s.audio_frames // 2,
                   max_target_positions=2 * s.seq, decoder_start_token_id=1, pad_token_id=0,
                   bos_token_id=1, eos_token_id=2)

    def inputs(seed: int, tiny: bool) -> Inputs:
        generator = torch.Generator().manual_seed(seed)
        # The encoder's positions are fixed by the config, so a tiny call only shrinks the batch.
        batch, target = (1, TINY_SEQ) if tiny else (s.batch, s.seq // 2)
        return Inputs(kwargs={
            "input_features": torch.randn(batch, mel_bins, s.audio_frames, generator=generator),
            "decoder_input_ids": _ids(generator, s.vocab, batch, target),
        })

    return BuiltModel(model, inputs)


@dataclass(frozen=True)
class AudioFeatures:
    """Wav2Vec2's convolutional feature encoder and its raw-audio input."""

    samples: int  # input length (16 kHz audio)
    conv_dim: tuple[int, ...]
    conv_stride: tuple[int, ...]
    conv_kernel: tuple[int, ...]
    position_kernel: int  # the convolutional position embedding's width


# Large is the released feature encoder (a frame per 320 samples, 2 s of audio).
WAV2VEC2 = {
    "small": AudioFeatures(samples=3200, conv_dim=(32,) * 3, conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                           position_kernel=16),
    "medium": AudioFeatures(samples=12800, conv_dim=(128,) * 5, conv_stride=(5, 2, 2, 2, 2),
                            conv_kernel=(10, 3, 3, 3, 3), position_kernel=32),
    "large": AudioFeatures(samples=32000, conv_dim=(512,) * 7, conv_stride=(5, 2, 2, 2, 2, 2, 2),
                           conv_kernel=(10, 3, 3, 3, 3, 2, 2), position_kernel=128),
}


def _wav2vec2(preset: str) -> BuiltModel:
    s, audio = SIZES[preset], WAV2VEC2[preset]
    model = _build("Wav2Vec2Model", "Wav2Vec2Config", hidden_size=s.hidden, num_hidden_layers=s.layers,
                   num_attention_heads=s.heads, intermediate_size=s.intermediate, conv_dim=audio.conv_dim,
                   conv_stride=audio.conv_stride, conv_kernel=audio.conv_kernel,
                   num_conv_pos_embeddings=audio.position_kernel, num_conv_pos_embedding_groups=4,
                   feat_extract_norm="layer", do_stable_layer_norm=True)

    def inputs(seed: int, tiny: bool) -> Inputs:
        generator = torch.Generator().manual_seed(seed)
        batch, length = (1, 800) if tiny else (s.batch, audio.samples)
        return Inputs(kwargs={"input_values": torch.randn(batch, length, generator=generator)})

    return BuiltModel(model, inputs)


# ViT/DeiT patch side: an 8 x 8 grid of patches below large, the released 16 px patches at large.
VIT_PATCH = {"small": 4, "medium": 8, "large": 16}


def _vit_like(class_name: str, config_name: str):
    def build(preset: str) -> BuiltModel:
        s = SIZES[preset]
        model = _build(class_name, config_name, image_size=s.image, patch_size=VIT_PATCH[preset],
                       hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
                       intermediate_size=s.intermediate)
        return BuiltModel(model, _pixels(s))

    return build


@dataclass(frozen=True)
class Stages:
    """A hierarchical vision model's stages (Swin, ConvNext): widths and block counts, stage by stage."""

    widths: tuple[int, ...]
    depths: tuple[int, ...]
    patch: int = 4  # the stem's downsampling
    heads: tuple[int, ...] = ()  # Swin: attention heads per stage
    window: int = 7  # Swin: attention window side


# Large is each model's released "tiny" layout (Swin-T, ConvNeXt-T); ResNet's below is ResNet-50's
# (medium: ResNet-18's).
# Swin doubles its width at every stage: only widths[0] is configured, the rest is for the reader.
SWIN = {
    "small": Stages(widths=(32, 64), depths=(2, 2), heads=(2, 4), patch=2, window=4),
    "medium": Stages(widths=(64, 128, 256), depths=(2, 2, 2), heads=(2, 4, 8), patch=2, window=4),
    "large": Stages(widths=(96, 192, 384, 768), depths=(2, 2, 6, 2), heads=(3, 6, 12, 24)),
}
CONVNEXT = {
    "small": Stages(widths=(16, 32), depths=(1, 1), patch=2),
    "medium": Stages(widths=(48, 96, 192, 384), depths=(1, 1, 3, 1), patch=2),
    "large": Stages(widths=(96, 192, 384, 768), depths=(3, 3, 9, 3)),
}


@dataclass(frozen=True)
class ResNetLayout:
    stem: int  # channels of the 7x7 stride-2 stem convolution
    widths: tuple[int, ...]
    depths: tuple[int, ...]
    block: str  # "basic" (two 3x3 convs) or "bottleneck" (1x1, 3x3, 1x1)


RESNET = {
    "small": ResNetLayout(stem=16, widths=(16, 32), depths=(1, 1), block="basic"),
    "medium": ResNetLayout(stem=64, widths=(64, 128, 256, 512), depths=(2, 2, 2, 2), block="basic"),
    "large": ResNetLayout(stem=64, widths=(256, 512, 1024, 2048), depths=(3, 4, 6, 3), block="bottleneck"),
}


def _swin(preset: str) -> BuiltModel:
    s, stages = SIZES[preset], SWIN[preset]
    model = _build("SwinModel", "SwinConfig", image_size=s.image, patch_size=stages.patch,
                   embed_dim=stages.widths[0], depths=list(stages.depths), num_heads=list(stages.heads),
                   window_size=stages.window)
    return BuiltModel(model, _pixels(s))


def _convnext(preset: str) -> BuiltModel:
    s, stages = SIZES[preset], CONVNEXT[preset]
    model = _build("ConvNextModel", "ConvNextConfig", image_size=s.image, patch_size=stages.patch,
                   hidden_sizes=list(stages.widths), depths=list(stages.depths), num_stages=len(stages.depths))
    return BuiltModel(model, _pixels(s))


def _resnet(preset: str) -> BuiltModel:
    s, layout = SIZES[preset], RESNET[preset]
    model = _build("ResNetModel", "ResNetConfig", embedding_size=layout.stem, hidden_sizes=list(layout.widths),
                   depths=list(layout.depths), layer_type=layout.block)
    return BuiltModel(model, _pixels(s))


def _hf(name: str, family: str, build, description: str, tolerance: float = 1e-3) -> ModelSpec:
    return ModelSpec(name, family, build, requires=("transformers",), tolerance=tolerance,
                     description=description)


MODELS = [
    _hf("bert", "encoder", _bert_like("BertForMaskedLM", "BertConfig"), "BertForMaskedLM"),
    _hf("distilbert", "encoder", _distilbert, "DistilBertModel"),
    _hf("roberta", "encoder", _bert_like("RobertaModel", "RobertaConfig", pad_token_id=0), "RobertaModel"),
    _hf("albert", "encoder", _bert_like("AlbertModel", "AlbertConfig", embedding_size=32),
        "AlbertModel (shared layers, factorised embeddings)"),
    _hf("electra", "encoder", _bert_like("ElectraModel", "ElectraConfig", embedding_size=32), "ElectraModel"),
    _hf("gpt2", "decoder", _gpt2, "GPT2LMHeadModel"),
    _hf("gpt_neo", "decoder", _gpt_neo, "GPTNeoForCausalLM (global + local attention)"),
    _hf("opt", "decoder", _opt, "OPTForCausalLM"),
    _hf("llama", "decoder", _llama_like("LlamaForCausalLM", "LlamaConfig"), "LlamaForCausalLM (GQA, RoPE)"),
    _hf("mistral", "decoder", _llama_like("MistralForCausalLM", "MistralConfig", sliding_window=16),
        "MistralForCausalLM (sliding window)"),
    _hf("qwen2", "decoder", _llama_like("Qwen2ForCausalLM", "Qwen2Config"), "Qwen2ForCausalLM"),
    _hf("phi", "decoder", _phi, "PhiForCausalLM (partial rotary)"),
    _hf("gemma", "decoder", _gemma, "GemmaForCausalLM (multi-query)"),
    _hf("t5", "encoder-decoder", _t5, "T5ForConditionalGeneration"),
    _hf("bart", "encoder-decoder", _bart_like("BartForConditionalGeneration", "BartConfig"),
        "BartForConditionalGeneration"),
    _hf("whisper", "audio", _whisper, "WhisperForConditionalGeneration"),
    _hf("wav2vec2", "audio", _wav2vec2, "Wav2Vec2Model (conv feature encoder)"),
    _hf("vit", "vision", _vit_like("ViTModel", "ViTConfig"), "ViTModel"),
    _hf("deit", "vision", _vit_like("DeiTModel", "DeiTConfig"), "DeiTModel"),
    _hf("swin", "vision", _swin, "SwinModel (shifted windows)"),
    _hf("convnext", "vision", _convnext, "ConvNextModel"),
    _hf("resnet_hf", "vision", _resnet, "ResNetModel"),
]
