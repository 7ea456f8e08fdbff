"""CUDA graphs for decoders: piece graphs (`piece`), padding (`padding`), per-call dispatch and FULL graphs
(`dispatch`), and the per-model pool and capture state (`runtime`)."""
