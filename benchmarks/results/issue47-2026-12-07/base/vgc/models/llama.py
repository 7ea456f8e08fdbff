"""Reference Llama-style decoder with random weights, served over a paged KV
cache through ``torch.ops.vgc.attention``, on one GPU or tensor-parallel.

The forward is written for the compiler: pure torch ops apart from the
attention op, no host syncs, no Python branches on shapes or values, and every
layer traced from the same code with the same constants, so that the layers'
FX graphs are identical and can be deduplicated.

Tensor parallelism (``cfg.sharded(rank, size)``) follows Megatron: q/k/v and
gate/up are column-parallel (each rank holds its heads and its slice of the
intermediate size), o and down are row-parallel with a ``vgc::all_reduce`` of
their partial sums, and each rank's KV cache holds its own KV heads. A shard
draws the same full weights as the unsharded model and keeps its slice, so
every tensor-parallel size computes the same function. Embeddings and norms
are replicated.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math

import torch
from torch import nn

from vgc import ops as _ops  # noqa: F401  (registers torch.ops.vgc.attention)
from vgc.ops.collectives import register_group
from vgc.ops.flat_batch import PAD_VALUES, is_uniform_decode, uniform_decode_of

__all__ = ["LlamaConfig", "Llama", "tiny_config", "llama_1b_config", "llama_8b_config",
           "make_kv_caches", "make_batch", "PAD_VALUES", "is_uniform_decode", "uniform_decode_of"]


@dataclasses.dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position: int = 1024
    block_size: int = 16
    num_blocks: int = 1280
    dtype: torch.dtype = torch.float32
    seed: int = 0
    # Tensor parallelism: this model holds shard `tp_rank` of `tp_size`.
    tp_size: int = 1
    tp_rank: int = 0

    def __post_init__(self):
        if not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise ValueError(f"tp_size must be a positive int, got {self.tp_size!r}")
        if not isinstance(self.tp_rank, int) or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank must be an int in [0, tp_size={self.tp_size}), got {self.tp_rank!r}")
        for name in ("num_heads", "num_kv_heads", "intermediate_size"):
            if getattr(self, name) % self.tp_size:
                raise ValueError(f"{name}={getattr(self, name)} is not divisible by tp_size={self.tp_size}; "
                                 "pick a tensor-parallel size that divides the heads and the intermediate size")

    def sharded(self, rank: int, size: int) -> "LlamaConfig":
        """This model as shard `rank` of `size` tensor-parallel shards."""
        return dataclasses.replace(self, tp_rank=rank, tp_size=size)

    @property
    def local_heads(self) -> int:
        return self.num_heads // self.tp_size

    @property
    def local_kv_heads(self) -> int:
        return self.num_kv_heads // self.tp_size

    @property
    def local_intermediate_size(self) -> int:
        return self.intermediate_size // self.tp_size

    @property
    def max_blocks_per_seq(self) -> int:
        # Fixed block_table width, so that batches differ only in their
        # number of tokens and sequences, not in this dimension.
        return -(-self.max_position // self.block_size)


def tiny_config() -> LlamaConfig:
    # 1280 blocks of 16 hold 640 decode sequences (context <= 30 tokens, two
    # blocks each) or 4 prefill sequences of up to max_position tokens.
    return LlamaConfig(vocab_size=256, hidden_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=16,
                       intermediate_size=128, max_position=1024,
                       block_size=16, num_blocks=1280)


def llama_1b_config() -> LlamaConfig:
    # Llama-3.2-1B shapes. max_position bounds this demo's contexts (not the
    # 128k the real model was trained for; llama3 rope scaling is omitted).
    # 2048 blocks of KV cache take 1 GiB in bf16 over the 16 layers.
    return LlamaConfig(vocab_size=128256, hidden_size=2048, num_layers=16,
                       num_heads=32, num_kv_heads=8, head_dim=64,
                       intermediate_size=8192, rope_theta=500000.0,
                       max_position=4096, block_size=16, num_blocks=2048,
                       dtype=torch.bfloat16)


def llama_8b_config() -> LlamaConfig:
    # Llama-3.1-8B shapes, for tensor-parallel benchmarks: 16 GB of bf16
    # weights; 2048 blocks of KV cache take 4 GiB over the 32 layers (TP=1).
    return dataclasses.replace(llama_1b_config(), hidden_size=4096, num_layers=32,
                               head_dim=128, intermediate_size=14336)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.to(x.dtype) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Neox-style rotary embedding of x [T, H, D] with cos/sin [T, D/2]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


def _uninitialized(module_cls, *args, **kwargs):
    # Llama._init_weights draws every weight, so nn's default init would be
    # wasted time (seconds at 1B). The default device honours any
    # `with torch.device(...)` context, meta included.
    return nn.utils.skip_init(module_cls, *args, **kwargs,
                              device=torch.empty(0).device)


def _linear(n_in: int, n_out: int, dtype: torch.dtype) -> nn.Linear:
    return _uninitialized(nn.Linear, n_in, n_out, bias=False, dtype=dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, tp_group_name: str | None = None):
        super().__init__()
        self.num_heads = cfg.local_heads
        self.num_kv_heads = cfg.local_kv_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        self.tp_group_name = tp_group_name   # None: no all-reduce (one shard)
        q_size = self.num_heads * cfg.head_dim
        kv_size = self.num_kv_heads * cfg.head_dim
        self.qkv_split = [q_size, kv_size, kv_size]
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        self.qkv_proj = _linear(cfg.hidden_size, q_size + 2 * kv_size,
                                cfg.dtype)
        self.o_proj = _linear(q_size, cfg.hidden_size, cfg.dtype)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        self.gate_up_proj = _linear(cfg.hidden_size,
                                    2 * cfg.local_intermediate_size, cfg.dtype)
        self.down_proj = _linear(cfg.local_intermediate_size, cfg.hidden_size,
                                 cfg.dtype)

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        # Row-parallel output: each rank holds a partial sum over its slice.
        if self.tp_group_name is None:
            return partial
        return torch.ops.vgc.all_reduce(partial, self.tp_group_name)

    def forward(self, x, cos, sin, kv_cache, slot_mapping, block_table,
                seq_lens, query_start_loc):
        q, k, v = self.qkv_proj(self.input_norm(x)).split(self.qkv_split, -1)
        q = _rotate(q.unflatten(-1, (self.num_heads, self.head_dim)), cos, sin)
        k = _rotate(k.unflatten(-1, (self.num_kv_heads, self.head_dim)),
                    cos, sin)
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        out = torch.empty_like(q)
        torch.ops.vgc.attention(out, q, k, v, kv_cache[0], kv_cache[1],
                                slot_mapping, block_table, seq_lens,
                                query_start_loc, self.scale)
        x = x + self._reduce(self.o_proj(out.flatten(1)))
        gate, up = self.gate_up_proj(self.post_norm(x)).chunk(2, dim=-1)
        return x + self._reduce(self.down_proj(nn.functional.silu(gate) * up))


class Llama(nn.Module):
    """The decoder, or its shard `cfg.tp_rank` of `cfg.tp_size`.

    A shard all-reduces over `tp_group` (default: the whole world, which must
    then have `cfg.tp_size` ranks). `tp_group` given with `tp_size` 1 runs the
    all-reduces over that one-rank group (a test of the collective path).
    """

    def __init__(self, cfg: LlamaConfig, tp_group=None):
        super().__init__()
        self.cfg = cfg
        group_name = None
        if cfg.tp_size > 1 or tp_group is not None:
            group_name = register_group(tp_group)
            size = (tp_group.size() if tp_group is not None
                    else torch.distributed.get_world_size())
            if size != cfg.tp_size:
                raise ValueError(f"cfg.tp_size={cfg.tp_size} but the tensor-parallel group has {size} ranks; "
                                 "pass tp_group= a group of tp_size ranks, or cfg.sharded(rank, group size)")
            rank = torch.distributed.get_rank(tp_group)
            if rank != cfg.tp_rank:   # else this rank would hold another rank's slices: a wrong answer
                raise ValueError(f"cfg.tp_rank={cfg.tp_rank} but this process is rank {rank} of the "
                                 f"tensor-parallel group; build it from cfg.sharded({rank}, {size})")
        self.embed_tokens = _uninitialized(nn.Embedding, cfg.vocab_size,
                                           cfg.hidden_size, dtype=cfg.dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, group_name)
                                    for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        exponents = torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim
        self.register_buffer("inv_freq", cfg.rope_theta ** -exponents,
                             persistent=False)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self):
        # Drawn on the CPU, so weights depend on cfg.seed alone, whatever the
        # device. Unit-scale embeddings and fan-in-scaled projections keep
        # scores O(1) (attention far from uniform, which keeps tests
        # sensitive); output projections are shrunk by 1/sqrt(2L) so the
        # residual stream stays O(1) over layers.
        if self.embed_tokens.weight.is_meta:
            return
        cfg = self.cfg
        residual = (2 * cfg.num_layers) ** -0.5
        shards = _shard_slices(cfg)
        plan = [(self.embed_tokens.weight, 1.0, None)]
        for layer in self.layers:
            for name, extra in (("qkv_proj", 1.0), ("o_proj", residual),
                                ("gate_up_proj", 1.0), ("down_proj", residual)):
                full_shape, take = shards[name]
                # std from the full fan-in, so every shard draws one model
                plan.append((getattr(layer, name).weight, extra / math.sqrt(full_shape[1]),
                             (full_shape, take) if cfg.tp_size > 1 else None))
        # One generator per tensor, seeded from cfg.seed, so that tensors can
        # be drawn in parallel threads (CPU randn is single-threaded: ~10 s
        # at 1B otherwise) and still come out the same every time.
        # device="cpu" everywhere: a `with torch.device("cuda")` around the
        # constructor must not move the draws off the CPU generators.
        seeds = torch.randint(2**62, (len(plan),), device="cpu",
                              generator=torch.Generator().manual_seed(
                                  self.cfg.seed)).tolist()

        @torch.no_grad()  # grad mode is per thread
        def fill(param, std, shard, seed):
            gen = torch.Generator().manual_seed(seed)
            if shard is None:
                param.copy_(torch.randn(param.shape, generator=gen, device="cpu") * std)
                return
            full_shape, take = shard
            param.copy_(take(torch.randn(full_shape, generator=gen, device="cpu")) * std)

        with concurrent.futures.ThreadPoolExecutor() as pool:
            for job in [pool.submit(fill, *p, seed)
                        for p, seed in zip(plan, seeds)]:
                job.result()

    def forward(self, input_ids, positions, kv_caches, slot_mapping,
                block_table, seq_lens, query_start_loc):
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"kv_caches has {len(kv_caches)} entries for "
                             f"{len(self.layers)} layers")
        freqs = positions.float().unsqueeze(-1) * self.inv_freq
        cos, sin = freqs.cos(), freqs.sin()
        x = self.embed_tokens(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches):
            x = layer(x, cos, sin, kv_cache, slot_mapping, block_table,
                      seq_lens, query_start_loc)
        return self.norm(x)


def _shard_slices(cfg: LlamaConfig) -> dict:
    """Per projection: the full (unsharded) weight's shape, and how this shard's
    weight is cut from it (rows of column-parallel, columns of row-parallel)."""
    r, d = cfg.tp_rank, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    q_l, kv_l, i_l = cfg.local_heads * d, cfg.local_kv_heads * d, cfg.local_intermediate_size
    inter = cfg.intermediate_size

    def rows(*starts_and_lengths):
        return lambda w: torch.cat([w[s:s + n] for s, n in starts_and_lengths])

    return {
        "qkv_proj": ((q + 2 * kv, cfg.hidden_size),
                     rows((r * q_l, q_l), (q + r * kv_l, kv_l), (q + kv + r * kv_l, kv_l))),
        "o_proj": ((cfg.hidden_size, q), lambda w: w[:, r * q_l:(r + 1) * q_l]),
        "gate_up_proj": ((2 * inter, cfg.hidden_size), rows((r * i_l, i_l), (inter + r * i_l, i_l))),
        "down_proj": ((cfg.hidden_size, inter), lambda w: w[:, r * i_l:(r + 1) * i_l]),
    }


def make_kv_caches(cfg: LlamaConfig, device="cpu") -> list[torch.Tensor]:
    """One zeroed [2 (K, V), num_blocks, block_size, Hkv, D] cache per layer (this shard's KV heads)."""
    shape = (2, cfg.num_blocks, cfg.block_size, cfg.local_kv_heads, cfg.head_dim)
    return [torch.zeros(shape, dtype=cfg.dtype, device=device)
            for _ in range(cfg.num_layers)]


def make_batch(cfg: LlamaConfig, num_tokens: int, kind: str = "prefill",
               device="cpu", seed: int = 0, kv_caches: list[torch.Tensor] | None = None,
               query_len: int = 1) -> dict:
    """Forward kwargs for a deterministic synthetic batch.

    The KV caches are fresh, or the given ones zeroed and refilled (CUDA graphs need caches that stay put).

    prefill: up to 4 sequences of new tokens from position 0, sizes as equal
    as possible. decode: `query_len` new tokens per sequence (1, or 1 + k with k speculative draft tokens;
    `num_tokens` a multiple of it), sequence i having ``1 + (7 * i) % 29`` earlier tokens whose K/V are random
    cache entries. Physical blocks are a random permutation, so that the block table is
    really exercised; unused block_table entries are 0.
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if query_len < 1 or num_tokens % query_len:
        raise ValueError(f"num_tokens ({num_tokens}) must be a multiple of query_len ({query_len}), which is >= 1")
    if kind == "prefill":
        num_seqs = min(4, num_tokens)
        base, extra = divmod(num_tokens, num_seqs)
        q_lens = [base + (i < extra) for i in range(num_seqs)]
        contexts = [0] * num_seqs
    elif kind == "decode":
        q_lens = [query_len] * (num_tokens // query_len)
        contexts = [1 + (7 * i) % 29 for i in range(len(q_lens))]
    else:
        raise ValueError(f"kind must be 'prefill' or 'decode', got {kind!r}")

    bs = cfg.block_size
    seq_lens = [c + q for c, q in zip(contexts, q_lens)]
    if max(seq_lens) > cfg.max_position:
        raise ValueError(f"a sequence of {max(seq_lens)} tokens exceeds "
                         f"cfg.max_position = {cfg.max_position}")
    blocks_needed = [-(-s // bs) for s in seq_lens]
    if sum(blocks_needed) > cfg.num_blocks:
        raise ValueError(f"batch needs {sum(blocks_needed)} KV cache blocks, "
                         f"more than cfg.num_blocks = {cfg.num_blocks}")

    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(cfg.vocab_size, (num_tokens,), generator=gen)
    physical = torch.randperm(cfg.num_blocks, generator=gen).tolist()
    block_table = torch.zeros(len(seq_lens), cfg.max_blocks_per_seq,
                              dtype=torch.int32)
    for b, n in enumerate(blocks_needed):
        block_table[b, :n] = torch.tensor(physical[:n])
        physical = physical[n:]

    def slots(b, start, end):
        pos = torch.arange(start, end)
        return block_table[b, pos // bs].long() * bs + pos % bs

    positions = torch.cat([torch.arange(c, c + q)
                           for c, q in zip(contexts, q_lens)])
    slot_mapping = torch.cat([slots(b, c, c + q)
                              for b, (c, q) in enumerate(zip(contexts, q_lens))])
    if kv_caches is None:
        kv_caches = make_kv_caches(cfg, device)
    else:
        for cache in kv_caches:
            cache.zero_()
    ctx_slots = torch.cat([slots(b, 0, c) for b, c in enumerate(contexts)])
    if ctx_slots.numel():
        shape = (cfg.num_layers, 2, ctx_slots.numel(), cfg.num_kv_heads,
                 cfg.head_dim)
        # Drawn on the target device: large decode batches need ~10^8 values, too slow to draw on the CPU.
        ctx_gen = torch.Generator(device).manual_seed(seed + 1)
        ctx_kv = torch.randn(shape, generator=ctx_gen, device=device).to(cfg.dtype)
        heads = slice(cfg.tp_rank * cfg.local_kv_heads, (cfg.tp_rank + 1) * cfg.local_kv_heads)
        ctx_kv = ctx_kv[:, :, :, heads]   # drawn whole, so every tensor-parallel size sees the same context
        ctx_slots = ctx_slots.to(device)
        for cache, kv in zip(kv_caches, ctx_kv):
            cache.flatten(1, 2)[:, ctx_slots] = kv

    query_start_loc = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    return {
        "input_ids": input_ids.to(device),
        "positions": positions.to(device),
        "kv_caches": kv_caches,
        "slot_mapping": slot_mapping.to(device),
        "block_table": block_table.to(device),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=device),
        "query_start_loc": query_start_loc.to(device),
    }
