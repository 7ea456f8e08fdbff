"""Custom ops of vgc. Importing this package registers ``torch.ops.vgc.*``."""

from .attention import attention, reference_attention
from .causal_attention import causal_attention
from .collectives import all_reduce
from .skinny_mm import skinny_mm
from .varlen_attention import reference_varlen_attention, varlen_attention

__all__ = ["all_reduce", "attention", "causal_attention", "reference_attention", "reference_varlen_attention",
           "skinny_mm", "varlen_attention"]
