"""CUDA graphs: piece graphs, FULL graphs, drop-in graphs, memory and traffic, and breakable capture of an eager
forward (`vgc.cudagraph.breakable`)."""

from vgc.cudagraph.breakable_capture import breakable, BreakableCaptureError, BreakableGraphs  # noqa: F401
