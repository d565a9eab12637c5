"""The main job, end to end, as far as the stages reach today (run through `python3 dev.py demo`)."""

from fireclay_ir import Graph, Program, TensorMeta


def main() -> None:
    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", ("s0", 128)))
    y = g.call("aten::relu.default", [x], out=TensorMeta("float32", ("s0", 128)))
    g.set_outputs([y])
    program = Program.single(g)
    print(f"built {program.main!r}")


if __name__ == "__main__":
    main()
