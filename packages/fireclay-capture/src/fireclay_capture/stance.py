"""``set_stance``: how compiled functions behave, as ``torch.compiler.set_stance``.

    set_stance("force_eager")                 # from now on
    with set_stance("eager_on_recompile"):    # inside the block
        ...
    @set_stance("fail_on_recompile")          # while the function runs
    def step(...): ...
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from fireclay_capture.config import config

_F = TypeVar("_F", bound=Callable[..., Any])

STANCES: dict[str, str] = {
    "default": "capture and compile as usual",
    "force_eager": "run every compiled function eagerly; its cache is kept for later",
    "eager_on_recompile": "use graphs already compiled; run eagerly where a new capture would be needed",
    "fail_on_recompile": "use graphs already compiled; raise RecompileError where a new capture would be needed",
}


def _checked(stance: Any) -> str:
    if stance not in STANCES:
        raise ValueError(f"unknown stance {stance!r}; stances are: "
                         + "; ".join(f"{name} ({what})" for name, what in STANCES.items()))
    return stance


class set_stance(contextlib.ContextDecorator):  # noqa: N801  (named as torch.compiler.set_stance)
    """Set the stance of every compiled function: at once when called, for a ``with`` block (the
    previous stance comes back at its end), or around each call of a decorated function."""

    def __init__(self, stance: str = "default"):
        self.stance = _checked(stance)
        # The call itself sets the stance (set_stance(...) as a plain function); a `with` block
        # around it restores what was there before the call.
        self._before_call: str | None = config.stance
        self._saved: list[str] = []
        config.stance = self.stance

    def __call__(self, fn: _F) -> _F:
        # As a decorator the stance applies only while fn runs: undo the call's setting.
        if self._before_call is not None:
            config.stance, self._before_call = self._before_call, None
        return super().__call__(fn)

    def __enter__(self) -> set_stance:
        if self._before_call is not None:
            self._saved.append(self._before_call)
            self._before_call = None
        else:
            self._saved.append(config.stance)
        config.stance = self.stance
        return self

    def __exit__(self, *exc: Any) -> None:
        config.stance = self._saved.pop()


def current_stance() -> str:
    return config.stance
