"""fireclay's settings: the umbrella's own section, composed with every stage's.

``fireclay.config`` holds what the umbrella itself reads (correctness checks, the compile cache,
debug output, background compiles, DDP splitting); each stage's section hangs off it by name,
loaded when first touched (so that ``import fireclay`` does not import torch)::

    import fireclay
    fireclay.config.verify_correctness = True                  # FIRECLAY_VERIFY_CORRECTNESS
    fireclay.config.capture.recompile_limit = 16               # FIRECLAY_CAPTURE_RECOMPILE_LIMIT
    with fireclay.config.loops.patch(fusion=False): ...        # FIRECLAY_LOOPS_FUSION
    fireclay.config.shared.cache_dir                           # FIRECLAY_CACHE_DIR

A section is the stage's own ``config`` object (``fireclay.config.capture is fireclay_capture.config``):
a stage used alone and the same stage under ``fireclay.compile`` read one value. Every section
follows one rule for its environment variables (:mod:`fireclay_ir.settings`); docs/settings.md
lists them all.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from typing import Any

from fireclay_ir.settings import SettingInfo, Settings, setting

# section name -> the package whose ``config`` it is
SECTIONS: dict[str, str] = {
    "shared": "fireclay_ir",
    "capture": "fireclay_capture",
    "loops": "fireclay_loops",
    "cpp": "fireclay_cpp",
    "triton": "fireclay_triton",
}


@dataclasses.dataclass
class Config(Settings, section=""):
    log: str = setting("", "log output to turn on, e.g. capture,loops=debug or recompiles,graph_breaks "
                           "(docs/debugging.md)")
    verbose: bool = setting(False, "log captures, recompiles (with the failing guard), graph breaks and perf "
                                   "hints at INFO on stderr")
    verify_correctness: bool = setting(False, "run the reference interpreter beside every compiled call and "
                                              "raise if the results differ")
    verify_rtol: float = setting(1e-4, "relative tolerance of verify_correctness")
    verify_atol: float = setting(1e-5, "absolute tolerance of verify_correctness")
    compile_cache: bool = setting(True, "reuse the autograd and loops stages' artifacts across processes "
                                        "(in the artifacts/ folder of the shared cache root)")
    debug_dir: str = setting("", "write every stage's program and each graph's generated kernels and "
                                 "wrapper under this folder, one folder per graph (empty: off)")
    # Off under mode="reduce-overhead", whose CUDA graphs must record compiled kernels.
    background_compile: bool = setting(True, "compile CUDA graphs' Triton kernels in the background and run "
                                             "the graph in the interpreter until they are ready")
    show_progress: bool = setting(True, "on a terminal, show which graph and stage a compile is in once it "
                                        "has taken longer than 2 s")
    # TorchDynamo's DDPOptimizer: a bucket's all-reduce starts while the backward of the earlier
    # pieces still runs.
    optimize_ddp: bool = setting(True, "under DistributedDataParallel, cut each captured graph at the "
                                       "gradient bucket boundaries and compile the pieces separately")

    def __getattr__(self, name: str) -> Any:
        # Only called for names that are not fields: the stages' sections, imported on first use.
        if name.startswith("_"):
            raise AttributeError(name)
        if name in SECTIONS:
            return importlib.import_module(SECTIONS[name]).config
        raise AttributeError(self.unknown_setting(name))

    def unknown_setting(self, name: str) -> str:
        for section, module in SECTIONS.items():
            found = importlib.util.find_spec(module) is not None and name in _section_fields(module)
            if found:
                return (f"fireclay.config has no setting {name!r}: it is a setting of the {section} section, "
                        f"fireclay.config.{section}.{name}")
        return (f"fireclay.config has no setting {name!r}; settings are: {', '.join(sorted(self.as_dict()))}, "
                f"and the sections {', '.join(SECTIONS)}")

    def on_change(self, name: str) -> None:
        if name == "verbose":
            importlib.import_module("fireclay.logs").set_verbose(self.verbose)
        elif name == "log":
            importlib.import_module("fireclay.logs").configure(self.log, source=self.environment_variable("log"))

    def sections(self) -> dict[str, Settings]:
        """Every stage's section that is installed (importing the stages)."""
        out = {}
        for section, module in SECTIONS.items():
            if importlib.util.find_spec(module) is not None:
                out[section] = getattr(self, section)
        return out

    def describe_all(self) -> list[SettingInfo]:
        """Every setting of fireclay and its installed stages, as docs/settings.md lists them."""
        return [*self.describe(), *(info for section in self.sections().values() for info in section.describe())]


def _section_fields(module: str) -> set[str]:
    return {f.name for f in dataclasses.fields(importlib.import_module(module).config)}


config = Config.from_environment()
