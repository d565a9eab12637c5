"""Errors the C++ backend raises for users."""

from __future__ import annotations


class CppBackendError(Exception):
    """Base class of fireclay-cpp's errors."""


class CodegenError(CppBackendError):
    """A scheduled program holds something the C++ code generator cannot express."""


class BuildError(CppBackendError):
    """The C++ compiler failed; the message holds its command line, its output and the source path."""
