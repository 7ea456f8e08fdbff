"""Encoder CUDA graphs: vision encoders replayed at a few token budgets, items packed greedily into them."""

from vgc.encoder.manager import EncoderCudaGraphManager
from vgc.encoder.pack import budget_levels, pack, PathBudgets, SubBatch
from vgc.encoder.protocol import (BudgetGraphMetadata, EncoderCudaGraphCaptureInputs, EncoderCudaGraphConfig,
                                  EncoderCudaGraphReplayBuffers, EncoderItemSpec, split_by_tokens,
                                  SupportsEncoderCudaGraph)

__all__ = ["BudgetGraphMetadata", "EncoderCudaGraphCaptureInputs", "EncoderCudaGraphConfig",
           "EncoderCudaGraphManager", "EncoderCudaGraphReplayBuffers", "EncoderItemSpec", "PathBudgets",
           "SubBatch", "SupportsEncoderCudaGraph", "budget_levels", "pack", "split_by_tokens"]
