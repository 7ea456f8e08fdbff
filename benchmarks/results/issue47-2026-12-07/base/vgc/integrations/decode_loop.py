"""generate()'s decoding loop on the device, for models prepared by `vgc.integrations.transformers.compile`.

transformers' loop does host work for every token: it copies the logits, runs each logits processor, picks the
token, appends it, checks the stopping criteria, reads back whether every row is done and builds the next call's
inputs. Against a FULL decode graph of ~1.4 ms that host work cost ~0.4 ms per token (H100, llama_1b, batch 1).

vgc hands generate() its own decoding method through transformers' `custom_generate` callable: generate()
prepares inputs, logits processors and stopping criteria as always, then calls it. The method runs the prefill,
then per token two graph replays and nothing else: the decode step's FULL graph, and a sampler graph chained after
it. The sampler graph runs the call's logits processors (transformers' own objects where they read only the scores
or the token history, what they compute where they read host-side lengths), picks the token as transformers does
(argmax, or `torch.multinomial`'s own draw for one sample: an exponential race, without multinomial's host-side
validity check), pads finished rows, updates each row's finished flag and writes the next decode step's inputs
into the FULL graph's buffers. The host reads the finished flags every `CHECK_EVERY` tokens, without waiting for
them, so it runs at most ~2 x CHECK_EVERY steps past the token where every row is done; tokens past the point where
transformers would have stopped are dropped.

A call the loop does not reproduce (a logits processor or stopping criterion it does not know, per-step outputs, a
streamer, a cache the caller brought, a batch size without a FULL graph) runs transformers' own loop, counted in
`stats()["decode_loop"]["fallbacks"]` under its reason.
"""

from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from vgc import cuda_runtime
from vgc.cudagraph.captured import capture_graph
from vgc.cudagraph.runtime import capture_failure

logger = logging.getLogger("vgc")

CHECK_EVERY = 8     # tokens between two reads of the finished flags
MAX_SAMPLERS = 16   # sampler graphs kept per model (batch size x settings); the least recently used is dropped

# transformers' logits processors that read the scores alone: the graph calls them as they are.
_SCORES_ONLY = frozenset({"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
                          "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper",
                          "SuppressTokensLogitsProcessor", "LogitNormalization"})
# ... that read the token history: called on a fixed-width history (see `_Sampler.reset`)
_HISTORY = frozenset({"RepetitionPenaltyLogitsProcessor"})
_STOPPING = frozenset({"MaxLengthCriteria", "EosTokenCriteria"})
# what generate() hands a decoding method besides the cache, when nothing else rides along
_MODEL_KWARGS = frozenset({"attention_mask", "use_cache", "logits_to_keep", "position_ids", "cache_position",
                           "return_dict", "output_attentions", "output_hidden_states"})


def _transformers_class(obj) -> str | None:
    """The class name of a transformers object, None for anything else (a user's subclass is not the original)."""
    cls = type(obj)
    return cls.__name__ if cls.__module__.startswith("transformers.") else None


def _frozen(value):
    """`value` as a hashable key part (a tensor by its values: each generate() builds its processors anew)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.flatten().tolist()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _ids(value) -> list[int]:
    """Token ids given as an int, a list or a tensor."""
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


@dataclass
class _Plan:
    """What the sampler graph of one call computes. `key` names what a captured graph bakes in."""
    key: tuple
    processors: list   # ("scores" | "history", processor) or ("min", eos ids, columns below which EOS is banned)
    do_sample: bool
    eos: list[int] | None
    pad: int
    new_tokens: int


def plan(engine, fresh_cache, input_ids, logits_processor, stopping_criteria, generation_config,
         model_kwargs: dict) -> _Plan | str:
    """The loop for this call, or why transformers' own loop runs it. `fresh_cache(cache)`: whether `cache` is
    the engine's own, with nothing in it yet."""
    if generation_config.return_dict_in_generate and any(
            getattr(generation_config, name, False) for name in
            ("output_scores", "output_logits", "output_attentions", "output_hidden_states")):
        return "per-step outputs (scores, logits, attentions or hidden states)"
    if getattr(generation_config, "prefill_chunk_size", None):
        return "chunked prefill"
    if not fresh_cache(model_kwargs.get(engine.cache_keyword)):
        return "a cache other than a fresh VgcCache"
    for name, value in model_kwargs.items():
        if name != engine.cache_keyword and name not in _MODEL_KWARGS and value is not None:
            return f"model keyword argument {name!r}"
    if model_kwargs.get("output_attentions") or model_kwargs.get("output_hidden_states"):
        return "per-step outputs (scores, logits, attentions or hidden states)"
    if input_ids.dim() != 2:
        return "input_ids that are not [batch, columns]"
    batch, columns = input_ids.shape
    step = engine.graph_step(batch) if batch <= engine.max_batch_size else None
    if step is None:
        return "no FULL decode graph for this batch size (CPU, or a size not captured)"
    logits = engine.compiled.graphs.full_graph_output(step.padded)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        return "a forward whose output is not one logits tensor"
    embeddings = engine.model.get_input_embeddings()
    if not isinstance(getattr(embeddings, "num_embeddings", None), int) or logits.shape[-1] > embeddings.num_embeddings:
        return "logits wider than the embedding table (a drawn id could be out of range)"

    max_length, eos = None, None
    for criterion in stopping_criteria:
        name = _transformers_class(criterion)
        if name not in _STOPPING:
            return f"stopping criterion {type(criterion).__name__}"
        if name == "MaxLengthCriteria":
            max_length = criterion.max_length if max_length is None else min(max_length, criterion.max_length)
        else:
            eos = sorted(set(_ids(criterion.eos_token_id)) | set(eos or ()))
    if max_length is None:
        return "no max_length"
    pad = None
    if eos is not None:
        pad_tensor = getattr(generation_config, "_pad_token_tensor", None)
        pad = generation_config.pad_token_id if pad_tensor is None else int(pad_tensor)
        if pad is None:
            return "EOS without a pad token"

    processors, key = [], []
    for processor in logits_processor:
        name = _transformers_class(processor)
        if name in _SCORES_ONLY:
            processors.append(("scores", processor))
            key.append((name, tuple(sorted((k, _frozen(v)) for k, v in vars(processor).items()))))
        elif name in _HISTORY:
            # the prompt's left padding, per row, changes from call to call: the graph's own processor takes each
            # call's (`_Sampler.reset`), so it is not part of the key
            ignored = getattr(processor, "prompt_ignore_length", None)
            if isinstance(ignored, int) and ignored >= columns:
                return "a repetition penalty that ignores the whole prompt"
            processors.append(("history", processor))
            key.append((name, processor.penalty, ignored if not isinstance(ignored, torch.Tensor) else "per row"))
        elif name == "MinLengthLogitsProcessor":
            ids = _ids(processor.eos_token_id)
            processors.append(("min", ids, processor.min_length))
            key.append((name, tuple(ids)))
        elif name == "MinNewTokensLengthLogitsProcessor":
            ids = _ids(processor.eos_token_id)
            processors.append(("min", ids, processor.prompt_length_to_skip + processor.min_new_tokens))
            key.append((name, tuple(ids)))
        else:
            return f"logits processor {type(processor).__name__}"
    new_tokens = max_length - columns
    if new_tokens < 1:
        return "no new tokens to generate"
    engine.check_fits(columns + new_tokens - 1)   # the decode steps skip the per-call checks
    do_sample = bool(generation_config.do_sample)
    return _Plan(key=(batch, do_sample, tuple(key), None if eos is None else tuple(eos), pad),
                 processors=processors, do_sample=do_sample, eos=eos, pad=pad or 0, new_tokens=new_tokens)


class _Sampler:
    """The sampler graph of one batch size and one `_Plan.key`: it reads the FULL decode graph's logits and writes
    the decode graph's next inputs, so the two replay back to back with nothing from the host between them.

    It owns every tensor it reads (its state, its EOS ids and the capture-time processor objects it calls): a
    graph replays the addresses it was captured with, and each generate() builds its processors anew."""

    def __init__(self, plan: _Plan, step, logits: torch.Tensor, width: int):
        engine = step.engine
        self.plan, self.batch = plan, step.batch
        device, batch = logits.device, step.batch
        self.logits = logits[:batch]
        self.ids, self.positions, self.seq_lens = (step.buffers[name][:batch]
                                                   for name in ("input_ids", "positions", "seq_lens"))
        self.slots = step.buffers["slot_mapping"][:batch]
        self.row_start = engine.row_start[:batch]
        long = {"dtype": torch.long, "device": device}
        history = any(kind == "history" for kind, *_ in plan.processors)
        self.tokens = torch.zeros(batch, width, **long)
        self.history = torch.zeros(batch, width if history else 1, **long)
        self.unfinished = torch.ones(batch, **long)
        self.alive = torch.zeros(width, dtype=torch.bool, device=device)
        # [the token this replay picks (0: the prefill's), the sequences' columns so far (transformers'
        # input_ids.shape[-1])]: one tensor, so that one kernel moves both on
        self.counters = torch.zeros(2, **long)
        self.index, self.columns = self.counters[:1], self.counters[1:]
        self.lens = torch.zeros(batch, **long)   # each row's length before the token this replay picks is fed
        vocab = torch.arange(logits.shape[-1], device=device)
        self.min_rules = [torch.isin(vocab, torch.tensor(ids, device=device))   # EOS ids banned below a length
                          for _, ids, _ in (p for p in plan.processors if p[0] == "min")]
        self.thresholds = torch.zeros(max(1, len(self.min_rules)), **long)
        self.eos = None if plan.eos is None else torch.tensor(plan.eos, **long)
        self.graph = None

    def _step(self) -> None:
        """One token: what transformers' loop body computes, then the next decode step's inputs."""
        batch, plan = self.batch, self.plan
        if not plan.processors and not plan.do_sample:
            scores = self.logits   # transformers' float32 copy is exact, so its argmax is the logits' own
        else:
            scores = self.logits.to(torch.float32, copy=True)
        rule = 0
        for kind, *item in plan.processors:
            if kind == "min":
                scores = torch.where(self.min_rules[rule] & (self.columns < self.thresholds[rule]), -math.inf, scores)
                rule += 1
            else:
                scores = item[0](self.history, scores)
        if plan.do_sample:
            probs = torch.softmax(scores, dim=-1)
            chosen = (probs / torch.empty_like(probs).exponential_(1)).argmax(dim=-1)
        else:
            chosen = scores.argmax(dim=-1)
        if self.eos is not None:
            chosen = chosen * self.unfinished + plan.pad * (1 - self.unfinished)
            self.unfinished.bitwise_and_(~(chosen[:, None] == self.eos).any(dim=-1))
        column = chosen[:, None]
        self.tokens.scatter_(1, self.index.view(1, 1).expand(batch, 1), column)
        if self.history.shape[1] > 1:
            self.history.scatter_(1, self.columns.view(1, 1).expand(batch, 1), column)
        self.alive.scatter_(0, self.index, self.unfinished.any().view(1))
        self.counters += 1
        self.ids.copy_(chosen)
        self.positions.copy_(self.lens)
        torch.add(self.lens, 1, out=self.seq_lens)
        torch.add(self.row_start, self.lens, out=self.slots)
        self.lens += 1

    def capture(self, pool) -> None:
        """Capture `_step` as a graph; the draws it makes while doing so are given back (a seeded generate()
        draws what eager draws). A step that cannot be captured runs eagerly, with one warning."""
        device = self.logits.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            try:
                self._step()   # warm-up: the allocator and each kernel's first launch, outside the capture
                self.graph = capture_graph(self._step, pool)
            except Exception as error:   # noqa: BLE001 - the same steps run without a graph
                logger.warning("generate()'s sampler step could not be captured as a CUDA graph (%s); it runs "
                               "eagerly, with the same tokens", capture_failure(error))

    def reset(self, chosen: _Plan, input_ids: torch.Tensor, lens: torch.Tensor) -> None:
        """Start a generate() of `chosen` (whose key is this sampler's): the prompt's rows, each row's length in
        the cache, every row unfinished. Device writes only: nothing waits for the device."""
        columns = input_ids.shape[1]
        self.unfinished.fill_(1)
        self.index.zero_()
        self.columns.fill_(columns)
        self.lens.copy_(lens)
        for rule, (_, _, threshold) in enumerate(p for p in chosen.processors if p[0] == "min"):
            self.thresholds[rule].fill_(threshold)
        if self.history.shape[1] == 1:
            return
        first = torch.zeros(input_ids.shape[0], 1, dtype=torch.long, device=input_ids.device)
        for (kind, *own), (_, *now) in zip(self.plan.processors, chosen.processors):
            if kind == "history":
                ignored = own[0].prompt_ignore_length
                if isinstance(ignored, torch.Tensor):
                    ignored.copy_(now[0].prompt_ignore_length)
                    first = ignored.view(-1, 1).long()
                elif isinstance(ignored, int):
                    first = first + ignored
        # transformers gathers the scores of every id of the sequences it does not ignore and scatters the
        # penalised ones back; the columns not written yet hold the first id it reads of each row again, which
        # changes nothing
        self.history[:, :columns].copy_(input_ids)
        self.history[:, columns:].copy_(input_ids.gather(1, first).expand(-1, self.history.shape[1] - columns))

    def launch(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()


class _FlagReader:
    """Whether any row was unfinished after a given token, read without waiting: a copy to pinned host memory
    and an event on CUDA (a plain copy elsewhere)."""

    def __init__(self, alive: torch.Tensor, index: int):
        if alive.is_cuda:
            self.host = torch.empty(1, dtype=torch.bool, pin_memory=True)
            self.host.copy_(alive[index:index + 1], non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host, self.event = alive[index:index + 1].clone(), None

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def alive(self) -> bool:
        if self.event is not None:
            self.event.synchronize()
        return bool(self.host[0])


class DecodeLoop:
    """The device loop of one `GenerationEngine`: its sampler graphs and what it served."""

    def __init__(self, engine, fresh_cache):
        self.engine, self.fresh_cache = engine, fresh_cache
        self.samplers: collections.OrderedDict[tuple, _Sampler] = collections.OrderedDict()
        self.pool = None
        self.generates = 0
        self.sampler_captures = 0
        self.fallbacks: collections.Counter[str] = collections.Counter()

    def fallback(self, reason: str) -> None:
        if reason not in self.fallbacks:
            logger.info("generate() runs transformers' decoding loop: %s", reason)
        self.fallbacks[reason] += 1

    def decode(self, model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
               streamer=None, **model_kwargs):
        """transformers' decoding method signature (`GenerationMixin._sample`'s): generate() calls it with what
        it prepared, through `custom_generate`."""
        mode = generation_config.get_generation_mode()
        if getattr(mode, "value", mode) not in ("greedy_search", "sample"):
            raise NotImplementedError(f"generation mode {getattr(mode, 'value', mode)!r}: vgc's integration serves "
                                      "greedy decoding and sampling")
        engine = self.engine
        chosen = "synced_gpus" if synced_gpus else "a streamer" if streamer is not None else plan(
            engine, self.fresh_cache, input_ids, logits_processor, stopping_criteria, generation_config,
            model_kwargs)
        if isinstance(chosen, str):
            self.fallback(chosen)
            return type(model)._sample(model, input_ids, logits_processor=logits_processor,
                                       stopping_criteria=stopping_criteria, generation_config=generation_config,
                                       synced_gpus=synced_gpus, streamer=streamer, **model_kwargs)
        sequences, cache = self._run(chosen, input_ids, model_kwargs)
        self.generates += 1
        if not generation_config.return_dict_in_generate:
            return sequences
        names = {f.name for f in fields(GenerateDecoderOnlyOutput)}
        return GenerateDecoderOnlyOutput(sequences=sequences,
                                         **{"cache" if "cache" in names else "past_key_values": cache})

    def _run(self, chosen: _Plan, input_ids: torch.Tensor, model_kwargs: dict):
        engine = self.engine
        cache = model_kwargs[engine.cache_keyword]
        batch = input_ids.shape[0]
        prefill = engine.run(cache, input_ids, model_kwargs.get("attention_mask"), 1)
        step, graphs = engine.graph_step(batch), engine.compiled.graphs
        padded = step.padded
        logits = graphs.full_graph_output(padded)
        logits[:batch].copy_(prefill[:, -1])   # the sampler reads the decode graph's output: the first token's
        sampler = self._sampler(chosen, step, logits)
        sampler.reset(chosen, input_ids.to(logits.device), cache.lens)
        step.stage(torch.zeros_like(cache.lens), cache.lens, cache.lens + 1)   # the sampler rewrites rows [:batch]
        sampler.launch()
        launched, pending = 1, collections.deque()
        while launched < chosen.new_tokens:
            if pending and (pending[0].ready() or len(pending) > 1):
                if not pending.popleft().alive():
                    break
            graphs.replay_full(padded)
            sampler.launch()
            launched += 1
            if chosen.eos is not None and launched % CHECK_EVERY == 0:
                pending.append(_FlagReader(sampler.alive, launched - 1))
        alive = sampler.alive[:launched].tolist()   # the one read that waits for the device
        kept = alive.index(False) + 1 if False in alive else launched
        sequences = torch.cat([input_ids.to(logits.device), sampler.tokens[:, :kept]], dim=1)
        cache.seen += kept - 1   # the last token is returned, not fed
        cache.lens = cache.lens + (kept - 1)
        return sequences, cache

    def _sampler(self, chosen: _Plan, step, logits: torch.Tensor) -> _Sampler:
        sampler = self.samplers.get(chosen.key)
        if sampler is not None and sampler.ids.data_ptr() == step.buffers["input_ids"].data_ptr() and \
                sampler.logits.data_ptr() == logits.data_ptr():
            self.samplers.move_to_end(chosen.key)
            return sampler
        sampler = _Sampler(chosen, step, logits, self.engine.max_cache_len + 1)
        if self.pool is None:
            self.pool = cuda_runtime.new_pool()
        sampler.capture(self.pool)
        self.sampler_captures += 1
        self.samplers[chosen.key] = sampler
        while len(self.samplers) > MAX_SAMPLERS:
            self.samplers.popitem(last=False)
        return sampler

    def stats(self) -> dict[str, Any]:
        return {"generates": self.generates, "sampler_graphs": len(self.samplers),
                "sampler_captures": self.sampler_captures, "fallbacks": dict(self.fallbacks)}
