"""Custom ops of vgc. Importing this package registers ``torch.ops.vgc.*``."""

from .attention import attention, reference_attention

__all__ = ["attention", "reference_attention"]
