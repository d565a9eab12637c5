"""fireclay's benchmark harness: one model suite, every backend side by side.

`python -m benchmarks.run --help` is the entry point; `benchmarks.models` holds the suite,
`benchmarks.backends` the table of backends, `benchmarks.measure` how each number is taken.
"""
