"""Reference Llama model on CPU: shapes, determinism, KV cache use.

Tolerance for fp32 comparisons between differently batched runs: atol 1e-5
on final-normed hidden states of magnitude O(1).
"""

import dataclasses

import pytest
import torch

from vgc.models import llama

ATOL = 1e-5


@pytest.fixture(scope="module")
def cfg(tiny):
    return tiny[0]


@pytest.fixture(scope="module")
def model(tiny):
    return tiny[1]


@pytest.mark.parametrize("kind", ["prefill", "decode"])
@pytest.mark.parametrize("num_tokens", [1, 3, 17, 64])
def test_forward_shapes(cfg, model, kind, num_tokens):
    batch = llama.make_batch(cfg, num_tokens, kind)
    num_seqs = min(4, num_tokens) if kind == "prefill" else num_tokens
    assert set(batch) == {"input_ids", "positions", "kv_caches",
                          "slot_mapping", "block_table", "seq_lens",
                          "query_start_loc"}
    assert batch["input_ids"].shape == (num_tokens,)
    assert batch["block_table"].shape == (num_seqs, cfg.max_blocks_per_seq)
    assert batch["query_start_loc"][-1] == num_tokens
    for key, dtype in (("input_ids", torch.int64), ("positions", torch.int64),
                       ("slot_mapping", torch.int64),
                       ("block_table", torch.int32), ("seq_lens", torch.int32),
                       ("query_start_loc", torch.int32)):
        assert batch[key].dtype == dtype, key
    with torch.no_grad():
        hidden = model(**batch)
    assert hidden.shape == (num_tokens, cfg.hidden_size)
    assert hidden.dtype == cfg.dtype and hidden.isfinite().all()


def test_decode_batch_layout(cfg):
    batch = llama.make_batch(cfg, 5, "decode")
    ctx = torch.tensor([1 + (7 * i) % 29 for i in range(5)])
    assert torch.equal(batch["positions"], ctx)
    assert torch.equal(batch["seq_lens"].long(), ctx + 1)
    # Slots of all sequences, context and new tokens, never collide.
    used = torch.cat([batch["slot_mapping"],
                      batch["kv_caches"][0][0].flatten(0, 1).abs().sum((1, 2))
                      .nonzero().flatten()])
    assert used.unique().numel() == used.numel() == 5 + ctx.sum()


def test_same_cfg_same_weights(cfg):
    a, b = llama.Llama(cfg).state_dict(), llama.Llama(cfg).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = llama.Llama(dataclasses.replace(cfg, seed=1)).state_dict()
    assert not torch.equal(a["embed_tokens.weight"], c["embed_tokens.weight"])


@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_make_batch_deterministic(cfg, kind):
    a, b = (llama.make_batch(cfg, 9, kind) for _ in range(2))
    for key in a:
        if key == "kv_caches":
            assert all(torch.equal(x, y) for x, y in zip(a[key], b[key]))
            assert a[key][0] is not b[key][0]
        else:
            assert torch.equal(a[key], b[key]), key
    other = llama.make_batch(cfg, 9, kind, seed=1)
    assert not torch.equal(a["input_ids"], other["input_ids"])


def test_make_batch_capacity(cfg):
    llama.make_batch(cfg, 600, "decode")
    llama.make_batch(cfg, 2400, "prefill")
    with pytest.raises(ValueError, match="num_blocks"):
        llama.make_batch(cfg, 1000, "decode")
    with pytest.raises(ValueError, match="max_position"):
        llama.make_batch(cfg, 4 * cfg.max_position + 4, "prefill")
    with pytest.raises(ValueError, match="kind"):
        llama.make_batch(cfg, 4, "chunked")


@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_forward_writes_kv_cache(cfg, model, kind):
    batch = llama.make_batch(cfg, 17, kind)
    before = [c.clone() for c in batch["kv_caches"]]
    with torch.no_grad():
        model(**batch)
    slots = batch["slot_mapping"]
    for old, new in zip(before, batch["kv_caches"]):
        flat_new, flat_old = new.flatten(1, 2), old.flatten(1, 2)
        assert (flat_new[:, slots].abs().sum((-1, -2)) > 0).all()
        rest = torch.ones(flat_new.shape[1], dtype=torch.bool)
        rest[slots] = False
        assert torch.equal(flat_new[:, rest], flat_old[:, rest])


def single_seq_batch(cfg, tokens, start, blocks, kv_caches):
    """Batch for one sequence whose new `tokens` start at position `start`."""
    n, bs = len(tokens), cfg.block_size
    positions = torch.arange(start, start + n)
    block_table = torch.zeros(1, cfg.max_blocks_per_seq, dtype=torch.int32)
    block_table[0, :len(blocks)] = torch.tensor(blocks)
    return dict(
        input_ids=tokens,
        positions=positions,
        kv_caches=kv_caches,
        slot_mapping=block_table[0, positions // bs].long() * bs
        + positions % bs,
        block_table=block_table,
        seq_lens=torch.tensor([start + n], dtype=torch.int32),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
    )


def test_incremental_decode_matches_full_prefill(cfg, model):
    # 21 tokens cross a block boundary; blocks are deliberately out of order.
    tokens = torch.randint(cfg.vocab_size, (21,),
                           generator=torch.Generator().manual_seed(3))
    blocks = [7, 3]
    with torch.no_grad():
        full = model(**single_seq_batch(
            cfg, tokens, 0, blocks, llama.make_kv_caches(cfg)))

        caches = llama.make_kv_caches(cfg)
        steps = [model(**single_seq_batch(cfg, tokens[:15], 0, blocks,
                                          caches))]
        for pos in range(15, 21):
            steps.append(model(**single_seq_batch(
                cfg, tokens[pos:pos + 1], pos, blocks, caches)))
    torch.testing.assert_close(torch.cat(steps), full, atol=ATOL, rtol=0)


def test_batched_decode_matches_single_sequences(cfg, model):
    # Each sequence of a decode batch must be independent of its neighbours.
    batch = llama.make_batch(cfg, 6, "decode")
    with torch.no_grad():
        together = model(**dict(batch, kv_caches=[c.clone() for c in
                                                  batch["kv_caches"]]))
        for b in range(6):
            alone = dict(batch, input_ids=batch["input_ids"][b:b + 1],
                         positions=batch["positions"][b:b + 1],
                         slot_mapping=batch["slot_mapping"][b:b + 1],
                         block_table=batch["block_table"][b:b + 1],
                         seq_lens=batch["seq_lens"][b:b + 1],
                         query_start_loc=torch.tensor([0, 1],
                                                      dtype=torch.int32),
                         kv_caches=[c.clone() for c in batch["kv_caches"]])
            torch.testing.assert_close(model(**alone)[0], together[b],
                                       atol=ATOL, rtol=0)


def test_deeper_variant_runs(cfg):
    deep = dataclasses.replace(cfg, num_layers=4)
    model = llama.Llama(deep)
    assert len(model.layers) == 4
    with torch.no_grad():
        hidden = model(**llama.make_batch(deep, 5, "decode"))
    assert hidden.shape == (5, cfg.hidden_size)
    with pytest.raises(ValueError, match="kv_caches"):
        model(**llama.make_batch(cfg, 5, "decode"))


def test_llama_1b_config():
    cfg = llama.llama_1b_config()
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
            cfg.head_dim, cfg.intermediate_size, cfg.vocab_size) == (
        2048, 16, 32, 8, 64, 8192, 128256)
    assert cfg.rope_theta == 500000.0 and cfg.dtype == torch.bfloat16
    with torch.device("meta"):
        model = llama.Llama(cfg)
    num_params = sum(p.numel() for p in model.parameters())
    assert 0.9e9 < num_params < 1.3e9
