"""Primitive-sync extension: the runtime's inner loops as ``torch.ops.odin.*`` (DESIGN 3.8).

``odin_ns.cuda.ops`` is the entry point: each op runs the compiled CPU or CUDA kernel for
its tensors' device, or the pure-torch reference in ``odin_ns.cuda.reference`` when the
extension cannot be built. Importing this package builds nothing.

``python -m odin_ns.cuda build [--cpu-only]`` builds ahead of time; ``python -m odin_ns.cuda
check`` prints which ops are compiled for which devices.
"""
