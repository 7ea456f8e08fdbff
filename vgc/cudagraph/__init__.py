"""CUDA graphs: piece graphs, FULL graphs, drop-in graphs, memory and traffic, and breakable capture of an eager
forward (`vgc.cudagraph.breakable`)."""

from vgc.cudagraph.breakable import BreakableCaptureError, BreakableGraphs, breakable  # noqa: F401
