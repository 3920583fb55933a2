"""Structured outputs with llguidance: a grammar compiled once per spec (cached), one matcher per constrained
request, the step's token bitmasks computed together for all its constrained rows and applied to the logits
before sampling, and jump-forward: the tokens a grammar forces are appended without a sampling step.

A matcher follows its request's accepted output tokens: advanced by each sampled token, and rebuilt from the
output so far where a request continues elsewhere (a decode worker taking over from a prefill worker). A
preempted request keeps its outputs, so its matcher stays valid while its KV is recomputed.

A spec with a trigger is lazy: its request samples freely, its output's bytes watched, until the trigger appears;
then its matcher starts on the output from the trigger on (retokenized: the grammar reads bytes, so a token that
straddles the trigger's start is no obstacle) and constrains the rest."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import llguidance
import numpy
import torch

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

from engine.core.sampling.constraint import GrammarCounters, GrammarSpec
from engine.core.sampling.sampler import RequestError

# compact JSON as json.dumps writes it (and the chat template renders tool calls): one spelling per value, so a
# small model cannot drift into whitespace, and every key and separator is forced
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT = '{"type": "object"}'
CACHE_SIZE = 256
log = logging.getLogger(__name__)
PARALLEL_ROWS = 32  # steps with this many constrained rows compute their masks on llguidance's threads


class GrammarError(RequestError):
    """A grammar or schema the library refuses (invalid, or using a keyword it cannot enforce)."""


def grammar_text(spec: GrammarSpec) -> str:
    """The spec in llguidance's grammar format; GrammarError when its source is not what its kind says."""
    try:
        if spec.kind in ("json_schema", "json_object"):
            source = spec.source if spec.kind == "json_schema" else ANY_OBJECT
            return str(llguidance.LLMatcher.grammar_from_json_schema(source, overrides=JSON_OPTIONS))
        if spec.kind == "lark":
            return str(llguidance.LLMatcher.grammar_from_lark(spec.source))
        return str(llguidance.LLMatcher.grammar_from_regex(spec.source))
    except ValueError as error:
        raise GrammarError(f"invalid {spec.kind}: {error}") from None


def check_grammar(spec: GrammarSpec) -> None:
    """GrammarError naming the problem when the grammar cannot be enforced; needs no tokenizer. Outcomes are
    cached by spec: a tool_choice "auto" request checks its tools' lazy grammar, usually the same every turn."""
    problem = _grammar_problem(spec)
    if problem:
        raise GrammarError(problem)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _grammar_problem(spec: GrammarSpec) -> str:
    """Why the grammar cannot be enforced; empty when it can."""
    try:
        text = grammar_text(spec)
    except GrammarError as error:
        return str(error)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text)
    return f"{spec.kind} cannot be enforced: {messages[0]}" if failed else ""


def json_schema_spec(schema: dict[str, Any]) -> GrammarSpec:
    return GrammarSpec("json_schema", json.dumps(schema, sort_keys=False))


def grammar_tokenizer(tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> llguidance.LLTokenizer:
    """llguidance's view of the engine's tokenizer, over the model's whole logits width (ids past the
    tokenizer's are never allowed); the engine's stop tokens end a grammar."""
    eos = list(eos_token_ids) or ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
    backend = getattr(tokenizer, "backend_json", None)
    if backend is not None:
        return llguidance.LLTokenizer(backend(), n_vocab=vocab_size, eos_token=eos)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocab(tokenizer, eos[0])), n_vocab=vocab_size,
                                  eos_token=eos)


class _ByteVocab:
    """A sentencepiece tokenizer as the byte strings of its pieces (meta space as a space, <0xNN> as a byte)."""

    def __init__(self, tokenizer: Any, eos_token_id: int) -> None:
        self.eos_token_id = eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.tokens = [_piece_bytes(tokenizer.piece(i)) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = [i for i in (tokenizer.bos_token_id, eos_token_id) if i is not None]
        self._encode = tokenizer.encode

    def __call__(self, text: str) -> list[int]:
        return self._encode(text)


def _piece_bytes(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode("utf-8")


def allowed_tokens(masks: torch.Tensor, width: int) -> numpy.ndarray:
    """Bitmasks [rows, words] int32 as booleans [rows, width] (little-endian words: byte k holds tokens 8k..8k+7);
    tokens past the masks' width are not allowed."""
    bits = numpy.unpackbits(masks.numpy().view(numpy.uint8), axis=1, bitorder="little").view(bool)
    if bits.shape[1] >= width:
        return bits[:, :width]
    return numpy.pad(bits, ((0, 0), (0, width - bits.shape[1])))


class GrammarCompiler:
    """Compiled grammars by spec (least recently used dropped past `size`); a request gets a copy."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, counters: GrammarCounters, size: int = CACHE_SIZE) -> None:
        self.tokenizer = tokenizer
        self.counters = counters
        self.size = size
        self._compiled: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()

    def matcher(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        key = (spec.kind, spec.source)
        self.counters.compile_queries += 1
        compiled = self._compiled.get(key)
        if compiled is not None:
            self.counters.compile_hits += 1
            self._compiled.move_to_end(key)
            return compiled.deep_copy()
        started = time.perf_counter()
        compiled = llguidance.LLMatcher(self.tokenizer, grammar_text(spec), log_level=0)
        self.counters.compile_seconds += time.perf_counter() - started
        if compiled.is_error():
            raise GrammarError(f"{spec.kind} cannot be enforced: {compiled.get_error()}")
        self._compiled[key] = compiled
        if len(self._compiled) > self.size:
            self._compiled.popitem(last=False)
        return compiled.deep_copy()


class Grammars:
    """One engine's constrained requests: their matchers, masks and forced tokens."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, vocab_size: int) -> None:
        self.counters = GrammarCounters()
        self.compiler = GrammarCompiler(tokenizer, self.counters)
        self.vocab_size = vocab_size
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        self._jump: dict[str, bool] = {}
        self._waiting: dict[str, tuple[GrammarSpec, bytes]] = {}  # lazy specs, with the output's last bytes
        self._executor = llguidance.LLExecutor()

    def add(self, request_id: str, spec: GrammarSpec, accepted: list[int], room: int) -> list[int]:
        """Start (or rebuild) a request's matcher from its accepted output tokens; the tokens the grammar then
        forces (at most `room`), which the caller appends to the output."""
        self.counters.constrained_requests += 0 if accepted else 1
        self._jump[request_id] = spec.jump_forward
        if spec.trigger:
            self._waiting[request_id] = (spec, b"")
            return self._watch(request_id, accepted, room)
        matcher = self.compiler.matcher(spec)
        if accepted and not matcher.consume_tokens(accepted):
            raise GrammarError(f"the output so far does not match the grammar: {matcher.get_error()}")
        self._matchers[request_id] = matcher
        return self._forced(request_id, matcher, room)

    def remove(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)
        self._jump.pop(request_id, None)
        self._waiting.pop(request_id, None)

    def constrains(self, request_id: str) -> bool:
        return request_id in self._matchers

    def bitmasks(self, request_ids: list[str]) -> torch.Tensor:
        """[len(request_ids), words] int32, bit t of row r set where request r may take token t: one tensor for the
        step, its rows filled one by one (about 20 us each) or, past PARALLEL_ROWS, on the library's threads (their
        hand-offs cost more than they save on a few rows, and far more on a busy host)."""
        words = (self.vocab_size + 31) // 32
        masks = torch.empty((len(request_ids), words), dtype=torch.int32)
        if len(request_ids) >= PARALLEL_ROWS:
            rows = [(self._matchers[rid], row) for row, rid in enumerate(request_ids)]
            self._executor.unsafe_compute_mask_ptr(rows, masks.data_ptr(), words * 4, len(request_ids))
            return masks
        for row, request_id in enumerate(request_ids):
            self._matchers[request_id].unsafe_compute_mask_ptr(masks[row].data_ptr(), words * 4)
        return masks

    def bitmask(self, request_id: str) -> torch.Tensor:
        """One request's mask alone: [words] int32."""
        mask = torch.empty((self.vocab_size + 31) // 32, dtype=torch.int32)
        self._matchers[request_id].unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)
        return mask

    def apply(self, logits: torch.Tensor, request_ids: list[str]) -> None:
        """Set to -inf, in place, the logits of tokens the rows' grammars forbid (unconstrained rows untouched).
        Host logits are masked row by row through numpy, off torch's intra-op threads: on a small step their
        wake-ups cost a hundred times the work on a loaded host."""
        rows = [row for row, rid in enumerate(request_ids) if rid in self._matchers]
        if not rows:
            return
        started = time.perf_counter()
        blocked = ~allowed_tokens(self.bitmasks([request_ids[row] for row in rows]), logits.shape[-1])
        if logits.device.type == "cpu" and logits.dtype == torch.float32:
            values = logits.numpy()
            for index, row in enumerate(rows):
                numpy.putmask(values[row], blocked[index], -numpy.inf)
        else:
            at = torch.tensor(rows, device=logits.device)
            logits[at] = logits[at].masked_fill(torch.from_numpy(blocked).to(logits.device), float("-inf"))
        self.counters.mask_seconds += time.perf_counter() - started
        self.counters.mask_steps += 1

    def accept(self, request_id: str, token: int, room: int) -> list[int]:
        """Advance a request's matcher by its sampled token; the tokens then forced (at most `room`)."""
        if request_id in self._waiting:
            return self._watch(request_id, [token], room)
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return []
        if not matcher.consume_token(token):  # the mask allowed it, so only a library fault gets here
            log.error("request %s: sampled token %d breaks its grammar (%s); it goes on unconstrained", request_id,
                      token, matcher.get_error())
            self.remove(request_id)
            return []
        return self._forced(request_id, matcher, room)

    def _watch(self, request_id: str, tokens: list[int], room: int) -> list[int]:
        """A lazy request's new output tokens: its matcher starts where its trigger first appears."""
        spec, tail = self._waiting[request_id]
        trigger = spec.trigger.encode()
        text = tail + self.compiler.tokenizer.decode_bytes(tokens)
        start = text.find(trigger)
        if start < 0:
            self._waiting[request_id] = (spec, text[max(0, len(text) - len(trigger) + 1):])
            return []
        del self._waiting[request_id]
        matcher = self.compiler.matcher(spec)
        if not matcher.consume_tokens(self.compiler.tokenizer.tokenize_bytes(text[start:])):
            log.warning("request %s: its output from %r on cannot match its grammar (%s); it goes on unconstrained",
                        request_id, spec.trigger, matcher.get_error())
            return []
        self._matchers[request_id] = matcher
        return self._forced(request_id, matcher, room)

    def _forced(self, request_id: str, matcher: llguidance.LLMatcher, room: int) -> list[int]:
        if room <= 0 or not self._jump[request_id] or matcher.is_stopped():
            return []
        forced = list(matcher.compute_ff_tokens())[:room]
        if forced and not matcher.consume_tokens(forced):
            raise GrammarError(f"forced tokens break the grammar: {matcher.get_error()}")
        self.counters.forced_tokens += len(forced)
        return forced
