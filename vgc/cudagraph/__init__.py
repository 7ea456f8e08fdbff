"""CUDA graph capture and replay (not built yet: `cudagraph_mode` other than NONE logs a warning)."""
