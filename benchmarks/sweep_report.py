"""The sweep's records and its results files: one Outcome per architecture, reasons grouped and
counted, written as JSON and Markdown."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

# pass: matches eager; wrong: ran but differs; raised: an exception escaped fireclay.compile(model)(...);
# skipped: eager itself cannot run the tiny model (or it cannot be built); timeout / crashed /
# harness-error: the model's process gave no result.
STATUSES = ("pass", "wrong", "raised", "skipped", "timeout", "crashed", "harness-error")


@dataclass
class Outcome:
    model_type: str
    class_name: str
    status: str = "pending"
    stage: str = ""  # where it failed: build / eager (skips), a fireclay stage (raised), result (wrong)
    reason: str = ""
    detail: str = ""  # traceback tail for raised and harness errors
    inputs: str = ""  # the forward arguments given
    shrink: str = ""  # "tiny", or "layers only" where the tiny widths do not build or run
    random: bool = False  # eager's outputs change with the seed: compared by shape
    random_sizes: bool = False  # their sizes too: compared by number of dimensions and dtype
    parameters: int = 0
    config_changes: int = 0
    graphs: int | None = None
    breaks: int | None = None
    break_reasons: list[str] = field(default_factory=list)
    eager_frames: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # fireclay's warnings: interpreter fallbacks and the like
    max_error: float | None = None
    dynamo_graphs: int | None = None
    dynamo_breaks: int | None = None
    dynamo_error: str = ""
    same_as_dynamo: bool = False  # a wrong result that TorchDynamo's graph gives too
    eager_seconds: float = 0.0
    fireclay_seconds: float = 0.0
    dynamo_seconds: float = 0.0
    seconds: float = 0.0

    def skip(self, stage: str, reason: str) -> None:
        self.status, self.stage, self.reason = "skipped", stage, reason

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def one_graph(self) -> bool:
        """Compiled in one graph, no break, nothing eager (and it ran)."""
        return (self.status in ("pass", "wrong") and self.graphs == 1 and not self.breaks
                and not self.eager_frames)

    @property
    def dynamo_one_graph(self) -> bool:
        return self.status not in ("skipped", "timeout", "crashed", "harness-error") and \
            self.dynamo_graphs == 1 and not self.dynamo_breaks

    @property
    def interpreter_fallbacks(self) -> list[str]:
        return [w for w in self.warnings if "interpreter" in w or "eagerly" in w]

    def summary_line(self) -> str:
        counts = f"graphs {self.graphs} breaks {self.breaks} eager {len(self.eager_frames)} " \
                 f"dynamo {self.dynamo_graphs}/{self.dynamo_breaks}"
        tail = f" {self.stage}: {self.reason}" if self.reason else ""
        return f"{self.status:8s} {counts} {self.seconds:.1f}s{tail[:200]}"


def normalise(reason: str) -> str:
    """A reason with what varies between models taken out, so that equal causes group together."""
    text = re.sub(r"\[[^\]]*\.py:\d+\]", "", reason)  # [file:line]
    text = re.sub(r"\b[\w./-]+\.py(:\d+)?", "<file>", text)
    text = re.sub(r"0x[0-9a-f]+", "0x?", text)
    text = re.sub(r"(?<![\w.])/[\w./-]+", "<path>", text)  # cache folders and the like
    text = re.sub(r"\b[0-9a-f]{16,}\b", "<hash>", text)
    text = re.sub(r"\b\d+(\.\d+)?(e-?\d+)?\b", "N", text)
    text = re.sub(r"\bN(, N)+\b", "N...", text)
    return re.sub(r"\s+", " ", text).strip()[:160]


def _without_function(frame_reason: str) -> str:
    """'Model.forward: the reason' -> 'the reason'."""
    head, sep, rest = frame_reason.partition(": ")
    return rest if sep and " " not in head else frame_reason


def group(outcomes: list[Outcome], items) -> list[tuple[str, int, list[str]]]:
    """(reason, number of architectures, example architectures), most common first; ``items`` maps
    an outcome to its reasons."""
    groups: dict[str, list[str]] = defaultdict(list)
    for o in outcomes:
        for reason in dict.fromkeys(normalise(r) for r in items(o)):
            groups[reason].append(o.model_type)
    return sorted(((r, len(m), m) for r, m in groups.items()), key=lambda g: (-g[1], g[0]))


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    by_status = {s: sum(1 for o in outcomes if o.status == s) for s in STATUSES}
    ran = [o for o in outcomes if o.status in ("pass", "wrong", "raised")]
    return {
        "architectures": len(outcomes),
        "by_status": by_status,
        "ran_in_eager": len(ran),
        "correct": by_status["pass"],
        "raised_from_fireclay": by_status["raised"],
        "silently_wrong": sum(1 for o in outcomes if o.status == "wrong" and not o.warnings),
        "wrong_as_dynamo": sum(1 for o in outcomes if o.status == "wrong" and o.same_as_dynamo),
        "one_graph_no_eager_frame": sum(1 for o in outcomes if o.one_graph),
        "dynamo_one_graph": sum(1 for o in ran if o.dynamo_one_graph),
        "with_eager_frames": sum(1 for o in ran if o.eager_frames),
        "with_breaks": sum(1 for o in ran if o.breaks),
        "with_interpreter_fallbacks": sum(1 for o in ran if o.interpreter_fallbacks),
    }


def write_results(out_base: str, outcomes: list[Outcome], meta: dict[str, Any]) -> None:
    ordered = sorted(outcomes, key=lambda o: o.model_type)
    data = {"meta": meta, "summary": summary(ordered), "results": [o.to_json() for o in ordered]}
    _atomic_write(out_base + ".json", json.dumps(data, indent=1, sort_keys=True))
    _atomic_write(out_base + ".md", markdown(ordered, meta))


def _atomic_write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _group_table(title: str, groups: list[tuple[str, int, list[str]]], note: str = "") -> list[str]:
    if not groups:
        return []
    lines = [f"### {title}", ""]
    if note:
        lines += [note, ""]
    lines += ["| architectures | reason | examples |", "| ---: | --- | --- |"]
    for reason, count, models in groups:
        examples = ", ".join(models[:6]) + (", ..." if len(models) > 6 else "")
        lines.append(f"| {count} | {_cell(reason)} | {examples} |")
    return lines + [""]


def markdown(outcomes: list[Outcome], meta: dict[str, Any]) -> str:
    s = summary(outcomes)
    lines = [f"# transformers sweep: {meta.get('device')}, {meta.get('dtype')}, {meta.get('mode')}", ""]
    lines.append(f"Command: `{meta.get('command', '')}`; commit {meta.get('commit', '?')}; torch "
                 f"{meta.get('torch')}, transformers {meta.get('transformers')}, Python {meta.get('python')}; "
                 f"{meta.get('cpus')} CPUs; started {meta.get('started')}"
                 + (f", finished {meta['finished']}" if meta.get("finished") else " (still running or interrupted)")
                 + f"; load average at start {meta.get('load_average_at_start')}.")
    lines += ["", f"{s['architectures']} of {meta.get('architectures_selected', '?')} selected architectures done.", ""]
    if meta.get("resumed_from"):
        lines += ["Results carried over from earlier runs of this sweep: " + "; ".join(meta["resumed_from"]) + ".", ""]
    if meta.get("not_run"):
        lines += [f"Stopped at its deadline; not run ({len(meta['not_run'])}): " + ", ".join(meta["not_run"]) + ".", ""]
    lines += ["| | count |", "| --- | ---: |"]
    rows = [("ran in eager (tiny config, generic inputs)", s["ran_in_eager"]),
            ("correct vs eager (every output)", s["correct"]),
            ("**exceptions escaping `fireclay.compile(model)(...)`**", s["raised_from_fireclay"]),
            ("wrong result", s["by_status"]["wrong"]),
            ("wrong result without any warning", s["silently_wrong"]),
            ("wrong result, the same as TorchDynamo's (the library's compile path)", s.get("wrong_as_dynamo", 0)),
            ("one graph, no break, no eager frame (fireclay)", s["one_graph_no_eager_frame"]),
            ("one graph, no break (TorchDynamo, same models)", s["dynamo_one_graph"]),
            ("with a frame that ran eagerly", s["with_eager_frames"]),
            ("with graph breaks", s["with_breaks"]),
            ("with a graph run in an interpreter or eagerly after a failure (warning)", s["with_interpreter_fallbacks"]),
            ("skipped: eager cannot run it (or it does not build)", s["by_status"]["skipped"]),
            ("timeout", s["by_status"]["timeout"]), ("crashed", s["by_status"]["crashed"]),
            ("harness error", s["by_status"]["harness-error"])]
    lines += [f"| {name} | {count} |" for name, count in rows] + [""]

    raised = [o for o in outcomes if o.status == "raised"]
    lines += ["## Reasons, grouped", ""]
    lines += _group_table("Exceptions escaping fireclay, by stage", group(raised, lambda o: [f"{o.stage}: {o.reason}"]))
    lines += _group_table("Wrong results", group([o for o in outcomes if o.status == "wrong"], lambda o: [o.reason]))
    lines += _group_table("Frames that ran eagerly", group(outcomes, lambda o: [_without_function(f) for f in o.eager_frames]),
                          "Each row counts architectures with at least one such frame.")
    lines += _group_table("Graph breaks", group(outcomes, lambda o: o.break_reasons))
    lines += _group_table("Fallback warnings (a graph in an interpreter, a frame eagerly)",
                          group(outcomes, lambda o: o.interpreter_fallbacks))
    lines += _group_table("Skipped (eager cannot run the tiny model, or it does not build)",
                          group([o for o in outcomes if o.status == "skipped"], lambda o: [f"{o.stage}: {o.reason}"]))
    lines += _group_table("No result", group([o for o in outcomes if o.status in ("timeout", "crashed", "harness-error")],
                                            lambda o: [f"{o.status}: {o.reason}"]))
    lines += _group_table("TorchDynamo errors (baseline)", group(outcomes, lambda o: [o.dynamo_error] if o.dynamo_error else []))

    lines += ["## Per architecture", "",
              "| architecture | status | graphs | breaks | eager frames | dynamo graphs / breaks | max rel err | s | reason |",
              "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    for o in outcomes:
        err = "" if o.max_error is None else f"{o.max_error:.1e}"
        dyn = "" if o.dynamo_graphs is None else f"{o.dynamo_graphs} / {o.dynamo_breaks}"
        why = o.reason or (o.eager_frames[0] if o.eager_frames else "")
        lines.append(f"| {o.model_type} | {o.status}{' (random sizes)' if o.random_sizes else ' (random)' if o.random else ''} | "
                     f"{'' if o.graphs is None else o.graphs} | {'' if o.breaks is None else o.breaks} | "
                     f"{len(o.eager_frames) if o.status not in ('skipped',) else ''} | {dyn} | {err} | {o.seconds:.1f} | "
                     f"{_cell(why[:200])} |")
    return "\n".join(lines) + "\n"
