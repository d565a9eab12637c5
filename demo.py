"""The main job, end to end: compile a Hugging Face model with fireclay and compare with eager.

Run through ``python3 dev.py demo`` (or ``python demo.py`` in an environment holding fireclay and
transformers). It builds a small BERT from a config (random weights, nothing downloaded), compiles
it with ``fireclay.compile`` (capture → autograd → loops → C++), checks the result against
eager, prints eager and compiled times and where the compile time went, prints the captured graph,
and writes an HTML report of the compile.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers

from fireclay.report import recording, write_report


def _median_seconds(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", default="fireclay-report.html", help="where to write the HTML report")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=2000, hidden_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=512, max_position_embeddings=128)
    model = transformers.BertModel(config).eval()
    input_ids = torch.randint(0, config.vocab_size, (4, 64))

    with recording(title="fireclay demo: BERT (2 layers, hidden 128)") as recorder:
        compiled = recorder.compile(model, fullgraph=True)
        start = time.perf_counter()
        with torch.no_grad():
            got = compiled(input_ids=input_ids).last_hidden_state
        first_call = time.perf_counter() - start

    with torch.no_grad():
        want = model(input_ids=input_ids).last_hidden_state
        error = (got - want).abs().max().item()
        eager = _median_seconds(lambda: model(input_ids=input_ids), args.repeats)
        fast = _median_seconds(lambda: compiled(input_ids=input_ids), args.repeats)

    events = recorder.events()
    captured = [g for g in events.graphs if g.stage == "capture"]
    print("== the captured graph (torch dialect), first lines ==")
    if captured:
        text = str(captured[0].program).splitlines()
        # Skip the header and the long input list: show the first nodes of the graph.
        head = next((i for i, line in enumerate(text) if line.lstrip().startswith("graph ")), 0)
        body = next((i for i, line in enumerate(text) if i > head and line.rstrip().endswith(":")), head)
        print(text[head])
        print("    ...")
        print("\n".join(text[body:body + 30]))
        print(f"... ({len(text)} lines in all; the full text is in the report)")

    print("\n== BERT, batch 4 x 64 tokens, CPU ==")
    print(f"max |compiled - eager|      {error:.2e}")
    print(f"first call (capture+compile) {first_call:8.3f} s")
    print(f"eager, median of {args.repeats:<3}        {eager * 1e3:8.2f} ms")
    print(f"fireclay, median of {args.repeats:<3}     {fast * 1e3:8.2f} ms   ({eager / fast:.2f}x eager)")
    print("\n== where the compile time went ==")
    for t in events.stage_times:
        print(f"{t.stage:<28} {t.seconds:8.3f} s  {t.note}")
    path = write_report(recorder, args.report)
    print(f"\nwrote {path}")
    if error > 1e-3:
        raise SystemExit(f"compiled output differs from eager by {error}")


if __name__ == "__main__":
    main()
