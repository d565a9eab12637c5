"""Without a CUDA GPU, graphs the tests route to fireclay-triton run in Triton's interpreter on
CPU tensors: the switch must be set before triton is first imported (``import fireclay`` imports
it), as in fireclay-triton's own tests."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
