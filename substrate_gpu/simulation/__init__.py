"""A simulated GPU node: device nodes, driver libraries and toolkit stand-ins.

Used by the demo, the benchmarks and the end-to-end tests. Nothing here is used on a real
node. The stand-ins reproduce the real tools' documented command lines, output shapes and
failure modes (see docs/gpu-injection.md, "Stand-ins"); they are not mocks of our code.
"""
