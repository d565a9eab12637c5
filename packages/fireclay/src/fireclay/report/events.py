"""What a compile report shows: :class:`CompileEvents`, filled by a recorder or by hand.

Every section is a list; a section whose stage did not record anything in this version is named
in ``not_recorded`` with the reason, and the page says so instead of showing an empty table that
would read as "nothing happened".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fireclay_ir import Program


@dataclass
class GraphEntry:
    title: str  # e.g. "f #0: captured", "f #0: aten forward"
    stage: str  # capture, autograd, loops, ...
    program: Program
    graph: str | None = None  # which graph of the program to draw; None: its entry
    # The module each node was made in, by node position, where its meta names none (a loops
    # program's kernels, traced back to the aten nodes they came from).
    modules: dict[int, str] | None = None

    @property
    def drawn(self):
        return self.program.graphs[self.graph or self.program.entry]


@dataclass
class GraphBreak:
    function: str
    reason: str  # the capture's message (what could not be traced and where)
    file: str | None = None
    line: int | None = None
    source_line: str | None = None


@dataclass
class GuardEntry:
    function: str
    entry: int  # which cache entry of the function
    text: str  # the guard function's source or a guard expression


@dataclass
class Recompile:
    function: str
    entry: int
    reason: str


@dataclass
class KernelEntry:
    graph: str  # the graph title it was generated for
    name: str
    language: str  # "cpp", "triton", "python" (wrapper)
    source: str


@dataclass
class StageTime:
    stage: str
    seconds: float
    note: str = ""


@dataclass
class TimelineEntry:
    """One stage of the run, in the order the stages started."""

    at: float  # seconds from the start of the recording to the stage's start
    stage: str
    label: str
    seconds: float  # its own time (nested stages left out)
    span: float  # start to end, nested stages included


@dataclass
class CompileEvents:
    title: str = "fireclay compile report"
    graphs: list[GraphEntry] = field(default_factory=list)
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    guards: list[GuardEntry] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    kernels: list[KernelEntry] = field(default_factory=list)
    stage_times: list[StageTime] = field(default_factory=list)
    timeline: list[TimelineEntry] = field(default_factory=list)
    schedules: list[tuple[str, str]] = field(default_factory=list)  # (graph title, schedule report)
    not_recorded: dict[str, str] = field(default_factory=dict)  # section -> why
    notes: list[str] = field(default_factory=list)
    time_notes: list[str] = field(default_factory=list)  # how the times were measured
    # The compile cache during the compile: stage -> hits, misses, stored, corrupt, ... (empty: not recorded)
    cache: dict[str, dict[str, float]] = field(default_factory=dict)

    def time(self, stage: str, seconds: float, note: str = "") -> None:
        self.stage_times.append(StageTime(stage, seconds, note))

    @classmethod
    def of_programs(cls, *programs: Program, title: str = "fireclay program report") -> CompileEvents:
        """Events holding only graphs: what a saved file can tell without running a compile."""
        events = cls(title=title)
        for i, program in enumerate(programs):
            label = program.metadata.get("capture", {}).get("function", f"program {i}")
            stage = program.producer[0].removeprefix("fireclay-")
            # A loops program's other graphs are kernel bodies: shown in its text form only.
            names = [program.entry] if "loops" in program.dialects else list(program.graphs)
            for name in names:
                events.graphs.append(GraphEntry(f"{label}: {name}", stage, program, name))
            events.guards.extend(GuardEntry(label, 0, g) for g in program.guards)
        why = "a saved program holds graphs, not the compile that made them; use `fireclay report SCRIPT.py`"
        for section in ("graph_breaks", "recompiles", "stage_times", "kernels"):
            events.not_recorded[section] = why
        if not events.guards:
            events.not_recorded["guards"] = why
        return events
