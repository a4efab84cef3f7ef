"""transformers `generate` as a policy engine (CPU or one GPU), with request micro-batching.

Log-probs are the model's own (temperature 1, before top-p) for each sampled token, from the
raw logits: the same quantity the trainer recomputes and vLLM reports by default, so the
importance ratio starts at 1 on-policy.

Concurrent requests (many rollouts in flight) are gathered into one left-padded batch of up
to `max_batch` prompts, decoded over the KV cache in a worker thread so tool calls keep running
meanwhile. Prompts that begin alike (a GRPO group's G samples of one task, turn after turn) share
one encoding of their common beginning (`shared_prefixes`), and a prompt that continues a sequence the engine
generated before (the next turn of its conversation) starts from that sequence's keys and values (`prefix_store`). Every request samples with its own seeded generator, so an answer depends on its
own seed only, never on which requests shared its batch. `lock` serialises model use: the
GRPO trainer holds it during an update so generation never reads half-updated weights. Each
answer stops at its own stop token or token limit.

Constrained decoding (`constrain=True`, the default): a request whose params name `tools` samples
its tool calls from the logits masked to what keeps the call well-formed with a real tool name and
schema keys (policy/constrained.py), and its log-probs are those of that masked distribution. With
`params.ground_arguments` (the default) the call's top-level argument values are also copied from the
request's context: the prompt ids are decoded once per request into a `Ground`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arenaforge.services.policy.base import EngineKind, Generation, SamplingParams
from arenaforge.services.policy.constrained import FREE, ToolCallConstraint, ground_of
from arenaforge.services.policy.prefix_store import PrefixStore


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future = field(repr=False)


class HfEngine:
    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, *, policy: str = "hf", device: str = "cpu",
                 max_batch: int = 16, constrain: bool = True, share_prefixes: bool = True,
                 prefix_cache_mb: int = 2048) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.policy = policy
        self.device = device
        self.max_batch = max_batch
        self.lock = threading.Lock()
        self.eos_ids = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
        if tokenizer.eos_token_id is not None:
            self.eos_ids.add(tokenizer.eos_token_id)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._queue: list[_Request] = []
        self._worker: asyncio.Task | None = None
        self.batches: list[int] = []  # sizes of the generate calls made (observability, tests)
        self.constrain = constrain
        self.share_prefixes = share_prefixes  # False: every prompt encoded whole (the bench's side-by-side baseline)
        self._constraint: Any = None  # built on first constrained request (one pass over the vocabulary)
        # what finished sequences computed, for the prompts that continue them (0: encode every prompt whole)
        self.prefix_store = PrefixStore(model, prefix_cache_mb << 20) if prefix_cache_mb > 0 else None

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu", constrain: bool = True) -> "HfEngine":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(path)).to(device)
        return cls(model, AutoTokenizer.from_pretrained(str(path)), policy=str(path), device=device,
                   constrain=constrain)

    def _constraint_for(self, width: int) -> Any:
        if self._constraint is None or self._constraint.vocab_size != width:
            self._constraint = ToolCallConstraint(self.tokenizer, width)
        return self._constraint

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(list(prompt_ids), params, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # let the other rollouts of this tick enqueue first
        while self._queue:
            batch = self._queue[: self.max_batch]
            for r in batch:
                self._queue.remove(r)
            live = [r for r in batch if not r.future.done()]  # a cancelled rollout no longer waits
            if not live:
                continue
            stop = threading.Event()
            try:
                results = await asyncio.to_thread(self._generate_batch, [r.prompt_ids for r in live],
                                                  [r.params for r in live], stop)
            except asyncio.CancelledError:
                # the run is being torn down (SIGTERM, Ctrl-C): asyncio.run waits for this thread, so it stops at its
                # next token rather than finishing the batch (minutes of a long one, and the process hung that long)
                stop.set()
                raise
            except Exception as err:  # noqa: BLE001 - handed to every waiting caller, who re-raises it
                for r in live:
                    if not r.future.done():
                        r.future.set_exception(err)
                continue
            for r, result in zip(live, results, strict=True):
                if not r.future.done():
                    r.future.set_result(result)

    def _generate_batch(self, prompts: list[list[int]], params: list[SamplingParams],
                        stop: threading.Event | None = None) -> list[Generation]:
        """One left-padded batch, decoded token by token over the KV cache.

        Our own loop rather than `model.generate`: each row samples with its own seeded generator
        (a batched `generate` draws from one global RNG, so only the first request's seed would
        count and a sample would depend on its batch neighbours), and stops on its own limit.
        """
        import torch

        stops = self.eos_ids | {t for p in params for t in p.stop_token_ids}
        rows = len(prompts)
        generators = [_generator(p.seed) for p in params]
        limits = [p.max_tokens for p in params]
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        finish: list[str | None] = [None] * rows
        constrained = [self.constrain and p.tools is not None for p in params]
        states: list[Any] = [FREE] * rows
        grounds = [ground_of(self.tokenizer, prompt) if c and p.ground_arguments else None
                   for prompt, p, c in zip(prompts, params, constrained, strict=True)]
        with self.lock, torch.no_grad():
            was_training = self.model.training
            self.model.eval()
            try:
                out, attn, positions = self._prefill(prompts)
                width, fed = attn.shape[1], 0  # the prefill's columns; generated tokens fed back since
                next_pos = positions[:, -1:] + 1
                for _ in range(max(limits)):
                    if stop is not None and stop.is_set():  # nobody waits for these answers any more
                        break
                    logits = out.logits[:, -1].float().cpu()
                    constraint = self._constraint_for(logits.shape[-1]) if any(constrained) else None
                    for i in range(rows):
                        if constrained[i] and finish[i] is None:  # outside a call only stray specials are masked
                            logits[i] = logits[i].masked_fill(~constraint.mask(states[i], params[i].tools), float("-inf"))
                    # temperature-1 log-probs of the distribution sampled from (masked when constrained)
                    raw = torch.log_softmax(logits, dim=-1)
                    step = torch.full((rows, 1), self.pad_id, dtype=torch.long)
                    for i in range(rows):
                        if finish[i] is not None:
                            continue
                        token = _sample(logits[i], params[i], generators[i])
                        if constrained[i]:
                            # None only past a dead end the mask let through freely: write freely from there
                            states[i] = constraint.advance(states[i], token, params[i].tools, grounds[i]) or FREE
                        tokens[i].append(token)
                        logprobs[i].append(float(raw[i, token]))
                        step[i, 0] = token
                        if token in stops:
                            finish[i] = "stop"
                        elif len(tokens[i]) >= limits[i]:
                            finish[i] = "length"
                    if all(f is not None for f in finish):
                        break
                    attn = torch.cat([attn, torch.ones((rows, 1), dtype=torch.long)], dim=1)
                    out = self.model(input_ids=step.to(self.device), attention_mask=attn.to(self.device),
                                     position_ids=next_pos.to(self.device), past_key_values=out.past_key_values,
                                     use_cache=True, logits_to_keep=1)
                    next_pos = next_pos + 1
                    fed += 1
                if self.prefix_store is not None:
                    self._keep(prompts, tokens, out.past_key_values, attn, width, fed)
            finally:
                if was_training:
                    self.model.train()
        self.batches.append(rows)
        return [Generation(token_ids=t, logprobs=lp, finish_reason=f or "length")  # type: ignore[arg-type]
                for t, lp, f in zip(tokens, logprobs, finish, strict=True)]

    def _keep(self, prompts: list[list[int]], tokens: list[list[int]], cache: Any, attn: Any, width: int,
              fed: int) -> None:
        """Store each row's keys and values: its prompt and the generated tokens that went back through the model (a
        row that stopped early was fed padding after its last token; the final step's tokens were never fed)."""
        import torch

        if any(layer.is_sliding for layer in cache.layers):  # a window drops old keys: nothing whole to keep
            return
        for i, (prompt, generated) in enumerate(zip(prompts, tokens, strict=True)):
            kept = min(len(generated), fed)
            columns = torch.cat([attn[i, :width].nonzero().squeeze(-1), torch.arange(width, width + kept)])
            columns = columns.to(self.device)
            kv = torch.stack([torch.stack([layer.keys[i].index_select(-2, columns),
                                           layer.values[i].index_select(-2, columns)]) for layer in cache.layers])
            self.prefix_store.put(prompt + generated[:kept], kv)

    def _stored_prefixes(self, prompts: list[list[int]]) -> list[tuple[int, Any]]:
        if self.prefix_store is None:
            return [(0, None)] * len(prompts)
        self.prefix_store.check_weights()  # a GRPO step since the last batch: nothing stored is valid any more
        return [self.prefix_store.longest(p) for p in prompts]

    def _prefill(self, prompts: list[list[int]]) -> tuple[Any, Any, Any]:
        """The forward pass over the prompts: (model output with its KV cache, attention mask, position ids).

        A GRPO group's G rollouts share their whole first prompt, and their later turns still share it: each run
        of prompts that begin alike is encoded once (`shared_prefixes`), its keys and values copied to its rows,
        and only the rest is encoded per row, after a gap the attention mask skips. Only the last position's
        logits are computed: a 49k vocabulary's logits at every prompt position are a fifth of the pass's work and
        most of its memory.
        """
        import torch

        stored = self._stored_prefixes(prompts)
        if any(n for n, _ in stored):
            self._share_the_rest(prompts, stored)
            return self._prefill_from_prefixes(prompts, stored)
        prefixes, owner, cut = shared_prefixes(prompts, 16 if self.share_prefixes else None)
        if len(prefixes) == len(prompts):  # nothing shared: one pass over the whole prompts
            ids, attn = _left_padded(prompts, self.pad_id)
            positions = (attn.cumsum(-1) - 1).clamp(min=0)
            out = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                             position_ids=positions.to(self.device), use_cache=True, logits_to_keep=1)
            return out, attn, positions
        head_ids, head_attn = _left_padded(prefixes, self.pad_id)
        head_pos = (head_attn.cumsum(-1) - 1).clamp(min=0)
        head = self.model(input_ids=head_ids.to(self.device), attention_mask=head_attn.to(self.device),
                          position_ids=head_pos.to(self.device), use_cache=True, logits_to_keep=1)
        index = torch.tensor(owner)
        cache = head.past_key_values
        cache.batch_select_indices(index.to(self.device))  # each row gets its prefix's keys and values
        tail_ids, tail_attn = _left_padded([p[c:] for p, c in zip(prompts, cut, strict=True)], self.pad_id)
        tail_pos = (torch.tensor(cut)[:, None] + tail_attn.cumsum(-1) - 1).clamp(min=0)
        attn = torch.cat([head_attn[index], tail_attn], dim=1)
        out = self.model(input_ids=tail_ids.to(self.device), attention_mask=attn.to(self.device),
                         position_ids=tail_pos.to(self.device), past_key_values=cache, use_cache=True,
                         logits_to_keep=1)
        return out, attn, tail_pos


    def _share_the_rest(self, prompts: list[list[int]], stored: list[tuple[int, Any]]) -> None:
        """Rows with nothing stored that begin alike (a new group's samples, batched with other groups' later turns):
        their common beginnings encoded once, in one pass, and given to them as if stored."""
        fresh = [i for i, (n, _) in enumerate(stored) if n == 0]
        if len(fresh) < 2 or not self.share_prefixes:
            return
        prefixes, owner, cut = shared_prefixes([prompts[i] for i in fresh], 16)
        runs = sorted({k for k in owner if owner.count(k) > 1})
        if not runs:
            return
        head = self._encode([prefixes[k] for k in runs])
        for j, i in enumerate(fresh):
            if owner[j] in runs:
                stored[i] = (cut[j], head[runs.index(owner[j])])

    def _encode(self, prefixes: list[list[int]]) -> list[Any]:
        """Each prefix's keys and values, (layers, 2, heads, len, dim), from one left-padded pass."""
        import torch

        ids, attn = _left_padded(prefixes, self.pad_id)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        cache = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                           position_ids=pos.to(self.device), use_cache=True, logits_to_keep=1).past_key_values
        width = ids.shape[1]
        return [torch.stack([torch.stack([layer.keys[k, :, width - len(p):], layer.values[k, :, width - len(p):]])
                             for layer in cache.layers]) for k, p in enumerate(prefixes)]

    def _prefill_from_prefixes(self, prompts: list[list[int]], stored: list[tuple[int, Any]]) -> tuple[Any, Any, Any]:
        """Rows whose beginning is stored start from its keys and values, left-padded into one cache; every row then
        encodes the rest of its prompt in one pass (a row with nothing stored, all of it)."""
        import torch
        from transformers import DynamicCache

        cut = [n for n, _ in stored]
        width = max(cut)
        sample = next(kv for _, kv in stored if kv is not None)
        layers, _, heads, _, dim = sample.shape
        prefix = torch.zeros((layers, 2, len(prompts), heads, width, dim), dtype=sample.dtype, device=sample.device)
        prefix_attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, (n, kv) in enumerate(stored):
            if n:
                prefix[:, :, i, :, width - n:] = kv
                prefix_attn[i, width - n:] = 1
        cache = DynamicCache([(prefix[layer, 0], prefix[layer, 1]) for layer in range(layers)])
        tail_ids, tail_attn = _left_padded([p[c:] for p, c in zip(prompts, cut, strict=True)], self.pad_id)
        tail_pos = (torch.tensor(cut)[:, None] + tail_attn.cumsum(-1) - 1).clamp(min=0)
        attn = torch.cat([prefix_attn, tail_attn], dim=1)
        out = self.model(input_ids=tail_ids.to(self.device), attention_mask=attn.to(self.device),
                         position_ids=tail_pos.to(self.device), past_key_values=cache, use_cache=True,
                         logits_to_keep=1)
        return out, attn, tail_pos


def shared_prefixes(prompts: Sequence[Sequence[int]],
                    min_shared: int | None = 16) -> tuple[list[list[int]], list[int], list[int]]:
    """(distinct prefixes, each row's prefix index, each row's prefix length) for one prefill.

    Prompts are sorted, and each run of neighbours sharing at least `min_shared` leading tokens gets one prefix,
    the run's longest common beginning; a prompt like no other (or every prompt, with `min_shared` None) is its own
    prefix. Every row keeps at least its last token out of its prefix, so the row's own pass yields its next-token
    logits.
    """
    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))
    prefixes: list[list[int]] = []
    owner = [0] * len(prompts)
    cut = [0] * len(prompts)
    run: list[int] = []
    shared = 0

    def close() -> None:
        prefixes.append(list(prompts[run[0]][:shared]))
        for i in run:
            owner[i], cut[i] = len(prefixes) - 1, shared

    for i in order:
        own = len(prompts[i]) - 1
        if run:
            common = min(shared, own, _common_length(prompts[run[-1]], prompts[i]))
            if min_shared is not None and common >= min_shared:
                run.append(i)
                shared = common
                continue
            close()
        run, shared = [i], own
    if run:
        close()
    return prefixes, owner, cut


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _left_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Any, Any]:
    """(ids, attention mask), every row ending in the last column; an empty row is all padding."""
    import torch

    width = max(1, *(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(list(r))
            attn[i, width - len(r):] = 1
    return ids, attn


def _generator(seed: int | None) -> Any:
    import torch

    if seed is None:
        return None
    return torch.Generator().manual_seed(seed)


def _sample(logits: Any, params: SamplingParams, generator: Any) -> int:
    """One token: greedy at temperature 0, else temperature + nucleus (top-p) sampling with `generator`."""
    import torch

    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < params.top_p  # the smallest prefix reaching top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def _standalone(**kw: Any) -> HfEngine:
    return HfEngine.from_pretrained(kw["model_path"], device=kw.get("device", "cpu"))


# in-process on the trainer's own model; its constrained decoding marks forced tokens (`Generation.extra`)
ENGINE = EngineKind("hf", build=_standalone, around_trainer_model=HfEngine, skips_forced_tokens=True)
