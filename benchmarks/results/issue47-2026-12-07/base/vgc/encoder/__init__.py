"""Encoder CUDA graphs: vision encoders replayed at a few token budgets, items packed greedily into them."""

from vgc.encoder.manager import EncoderCompileError, EncoderCudaGraphManager
from vgc.encoder.pack import budget_levels, pack, PathBudgets, SubBatch
from vgc.encoder.protocol import (BudgetGraphMetadata, DEFAULT_PATH, edge_fill, EncoderCudaGraphCaptureInputs,
                                  EncoderCudaGraphConfig, EncoderCudaGraphReplayBuffers, EncoderItemSpec, GLOBAL_PATH,
                                  LOCAL_PATH, split_by_tokens, SupportsEncoderCudaGraph)

__all__ = ["DEFAULT_PATH", "GLOBAL_PATH", "LOCAL_PATH", "BudgetGraphMetadata", "EncoderCompileError",
           "EncoderCudaGraphCaptureInputs", "EncoderCudaGraphConfig", "EncoderCudaGraphManager",
           "EncoderCudaGraphReplayBuffers", "EncoderItemSpec", "PathBudgets", "SubBatch", "SupportsEncoderCudaGraph",
           "budget_levels", "edge_fill", "pack", "split_by_tokens"]
