"""The compile modes and the backend options each one sets (``list_mode_options``)."""

from __future__ import annotations

from typing import Any

_MODES: dict[str, dict[str, Any]] = {
    "default": {"cudagraphs": False, "max_autotune": False},
    # Launch overhead dominates small models on GPUs: replay the whole call as a CUDA graph.
    "reduce-overhead": {"cudagraphs": True, "max_autotune": False},
    # Spend compile time searching kernel configurations (and matmul templates) for speed.
    "max-autotune": {"cudagraphs": True, "max_autotune": True},
    "max-autotune-no-cudagraphs": {"cudagraphs": False, "max_autotune": True},
}


def list_modes() -> list[str]:
    return list(_MODES)


def list_mode_options(mode: str | None = None) -> dict[str, Any]:
    """The backend options ``mode`` sets (``None`` means ``"default"``)."""
    mode = mode or "default"
    if mode not in _MODES:
        raise ValueError(f"unknown mode {mode!r}; modes are: {', '.join(_MODES)}")
    return dict(_MODES[mode])


# torch.compile's option names for the same knobs (Inductor's config keys).
ALIASES = {"triton.cudagraphs": "cudagraphs"}


def resolve_options(mode: str | None, options: dict[str, Any] | None) -> dict[str, Any]:
    """Mode defaults overridden by explicit ``options`` (torch.compile forbids both; so do we).
    Unknown modes, unknown option names and values of the wrong type are errors here."""
    if mode is not None and not isinstance(mode, str):
        raise TypeError(f"mode must be a string ({', '.join(_MODES)}) or None, got {mode!r}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"options must be a dict of option name -> value, got {type(options).__name__}")
    if mode is not None and options:
        raise ValueError("pass either mode= or options= to fireclay.compile, not both")
    resolved = list_mode_options(mode)
    for key, value in (options or {}).items():
        name = ALIASES.get(key, key)
        if name not in resolved:
            raise ValueError(f"unknown compile option {key!r}; options are: {', '.join(resolved)}"
                             f" (fireclay.list_mode_options() shows each mode's)")
        if type(value) is not type(resolved[name]):
            raise TypeError(f"compile option {key!r} must be {type(resolved[name]).__name__}, got {value!r}")
        resolved[name] = value
    return resolved
