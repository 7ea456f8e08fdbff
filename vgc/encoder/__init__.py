"""Encoder CUDA graphs: vision encoders replayed at a few token budgets, items packed greedily into them."""

from vgc.encoder.manager import EncoderCudaGraphManager
from vgc.encoder.pack import PathBudgets, SubBatch, budget_levels, pack
from vgc.encoder.protocol import (BudgetGraphMetadata, EncoderCudaGraphCaptureInputs, EncoderCudaGraphConfig,
                                  EncoderCudaGraphReplayBuffers, EncoderItemSpec, SupportsEncoderCudaGraph,
                                  split_by_tokens)

__all__ = ["BudgetGraphMetadata", "EncoderCudaGraphCaptureInputs", "EncoderCudaGraphConfig",
           "EncoderCudaGraphManager", "EncoderCudaGraphReplayBuffers", "EncoderItemSpec", "PathBudgets",
           "SubBatch", "SupportsEncoderCudaGraph", "budget_levels", "pack", "split_by_tokens"]
