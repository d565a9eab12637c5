"""One settings mechanism for every fireclay package: a typed section per package, environment
variables named by one rule, and ``patch()``.

A package declares its section as a dataclass deriving from :class:`Settings`, naming the section,
and keeps one instance of it as its ``config``::

    @dataclasses.dataclass
    class LoopsSettings(Settings, section="loops"):
        fusion: bool = setting(True, "fuse loop nodes into kernels")

    config = LoopsSettings.from_environment()

**The environment rule.** Field ``name`` of a section is read from ``FIRECLAY_<SECTION>_<NAME>``
(capitals); the two shared sections, fireclay-ir's (what every stage reads: the cache folder,
boundary verification) and the umbrella's, have no section part: ``FIRECLAY_<NAME>``. Variables are
read when the instance is made by :meth:`Settings.from_environment` (at the package's import) and
again by :meth:`Settings.reload_from_environment`; a value that does not parse as the field's type
is an error naming the variable.

**Values.** A field's type annotation is its contract: ``bool``, ``int``, ``float``, ``str``,
``tuple[str, ...]`` (comma-separated in the environment; ``none`` or ``0`` for the empty tuple)
and any of these ``| None`` (an empty variable then means None). Assigning a value of another type,
or a name that is not a field, raises at once. ``patch(**changes)`` sets fields for a ``with``
block or a decorated function and puts the old values back afterwards.

Every section's fields, variables, defaults and meanings are listed in docs/settings.md; the
umbrella's tests check that the list and the code agree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = ["Settings", "SettingInfo", "setting"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def setting(default: Any, doc: str) -> Any:
    """A field of a settings section: its default and what it does (one line, for the docs)."""
    return dataclasses.field(default=default, metadata={"doc": doc})


@dataclasses.dataclass(frozen=True, kw_only=True)
class SettingInfo:
    """One field of a section, as the docs list it."""

    section: str
    name: str
    variable: str
    type: str
    default: Any
    doc: str


def _field_types(cls: type) -> dict[str, Any]:
    # (cached by class; typed Any there: the checker takes a dataclass's class for unhashable)
    return _field_types_of(cls)


@functools.cache
def _field_types_of(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _unwrap_optional(kind: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None``, ``(kind, False)`` otherwise."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(kind)) == 2:
            return args[0], True
    return kind, False


def _type_name(kind: Any) -> str:
    base, optional = _unwrap_optional(kind)
    name = "tuple of str" if typing.get_origin(base) is tuple else base.__name__
    return f"{name} or None" if optional else name


def _parse(kind: Any, raw: str) -> Any:
    """The value of an environment variable, as a field of type ``kind``."""
    base, optional = _unwrap_optional(kind)
    text = raw.strip()
    if optional and text == "":
        return None
    if base is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE or text == "":
            return False
        raise ValueError(f"expected a boolean (1/0, true/false, yes/no, on/off), got {raw!r}")
    if typing.get_origin(base) is tuple:
        names = tuple(part.strip().lower() for part in text.split(",") if part.strip())
        return () if names in (("none",), ("0",)) else names
    if base is str:
        return raw
    try:
        return base(text)
    except ValueError:
        raise ValueError(f"expected {base.__name__}, got {raw!r}") from None


def _accepts(kind: Any, value: Any) -> bool:
    base, optional = _unwrap_optional(kind)
    if value is None:
        return optional
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typing.get_origin(base) is tuple:
        return isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    return isinstance(value, base)


class Settings:
    """Base of every package's settings section (a dataclass; see the module docstring)."""

    SECTION: ClassVar[str] = ""

    def __init_subclass__(cls, section: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.SECTION = section

    # -- the environment

    @classmethod
    def environment_variable(cls, name: str) -> str:
        """The variable field ``name`` is read from (the one rule)."""
        middle = f"{cls.SECTION.upper()}_" if cls.SECTION else ""
        return f"FIRECLAY_{middle}{name.upper()}"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None, **values: Any) -> Any:
        """An instance with the defaults, ``values``, then the environment's variables applied."""
        return cls(**values).reload_from_environment(environ)

    def reload_from_environment(self, environ: Mapping[str, str] | None = None) -> Any:
        """Apply every ``FIRECLAY_*`` variable of this section that is set; returns ``self``."""
        environ = os.environ if environ is None else environ
        for name, kind in _field_types(type(self)).items():
            variable = self.environment_variable(name)
            raw = environ.get(variable)
            if raw is None:
                continue
            try:
                value = _parse(kind, raw)
            except ValueError as exc:
                raise ValueError(f"environment variable {variable}: {exc}") from None
            setattr(self, name, value)
        return self

    @classmethod
    def describe(cls) -> list[SettingInfo]:
        """Every field of the section, with its variable, type, default and meaning."""
        out = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
            out.append(SettingInfo(section=cls.SECTION, name=f.name, variable=cls.environment_variable(f.name),
                                   type=_type_name(_field_types(cls)[f.name]), default=default,
                                   doc=f.metadata.get("doc", "")))
        return out

    # -- values

    def __setattr__(self, name: str, value: Any) -> None:
        kinds = _field_types(type(self))
        if name not in kinds:
            raise AttributeError(self.unknown_setting(name))
        if not _accepts(kinds[name], value):
            raise TypeError(f"{self._where()}.{name} expects {_type_name(kinds[name])}, got {value!r}")
        object.__setattr__(self, name, value)
        self.on_change(name)

    def on_change(self, name: str) -> None:
        """Called after field ``name`` is set (a section whose knob must act at once overrides it)."""

    def _where(self) -> str:
        return f"{type(self).__module__.split('.')[0]}.config"

    def unknown_setting(self, name: str) -> str:
        """The message for a name that is not a setting (a section may point to where it lives)."""
        return (f"{self._where()} has no setting {name!r}; settings are: "
                f"{', '.join(sorted(_field_types(type(self))))}")

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _field_types(type(self))}

    def patch(self, **changes: Any) -> _Patch:
        """Set fields temporarily; usable as ``with config.patch(...)`` and ``@config.patch(...)``."""
        kinds = _field_types(type(self))
        for name, value in changes.items():
            if name not in kinds:
                raise AttributeError(self.unknown_setting(name))
            if not _accepts(kinds[name], value):
                raise TypeError(f"{self._where()}.{name} expects {_type_name(kinds[name])}, got {value!r}")
        return _Patch(self, changes)


class _Patch(contextlib.ContextDecorator):
    """Sets fields on entry and restores them on exit; nests and re-enters."""

    def __init__(self, settings: Settings, changes: dict[str, Any]):
        self.settings = settings
        self.changes = changes
        self.saved: list[dict[str, Any]] = []

    def __enter__(self) -> Any:
        self.saved.append({name: getattr(self.settings, name) for name in self.changes})
        for name, value in self.changes.items():
            setattr(self.settings, name, value)
        return self.settings

    def __exit__(self, *exc: Any) -> None:
        for name, value in self.saved.pop().items():
            setattr(self.settings, name, value)
