"""fireclay-triton's errors: each says what failed and what to do."""


class TritonBackendError(Exception):
    """Base class of fireclay-triton's errors."""


class CodegenError(TritonBackendError):
    """A scheduled kernel could not be written as Triton."""


class InputError(TritonBackendError, TypeError):
    """A compiled program was called with inputs unlike those it was compiled for."""
