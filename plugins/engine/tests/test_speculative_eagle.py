"""EAGLE-3 draft speculation through `LLM(target, speculative=DRAFT_DIR)`: the draft resolves through the
`draft_model` slot; greedy tokens equal plain decoding across mixed batches, chunked prefill and preemption; a draft
derived from its target gets its guesses accepted; no stale draft state carries into later requests; sampling keeps
the target's distribution; bad draft folders are DraftMismatch / MissingWeights before any token; `kernelbay explain`
explains every vendored EAGLE-3 config.

Draft folders are written by tests/eagle3_drafts.py in SpecForge's format (nothing shared with a trainer but it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from kernelbay_engine import LLM, SamplingParams
from kernelbay_engine.args import EngineArgumentError
from kernelbay_engine.errors import DraftMismatch, MissingWeights
from kernelbay_engine.scheduler import Scheduler

from .checkpoints import build_tiny_llama
from .eagle3_drafts import draft_config, random_tensors, target_config, vocabulary_maps, write_draft
from .test_speculative import assert_sampling_follows_plain_decoding

SHARED = Path(__file__).resolve().parents[3] / "tests" / "data" / "configs"
GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
VOCAB = 320
AUX_LAYERS = [1, 2, 3]


def build_counting_target(folder: Path, *, attention_share: float = 0.05, seed: int = 0) -> Path:
    """A tiny 4-layer Llama whose greedy next token is mostly its input token + 1: the MLPs write nothing and the
    attention little (o_proj scaled down), so the residual stream stays near the token's embedding, which the LM head
    reads back shifted by one. Its attention still mixes the context, so not every step counts."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.zero_()
            layer.self_attn.o_proj.weight.mul_(attention_share)
        model.lm_head.weight.copy_(torch.roll(_unit_embeddings(model.model.embed_tokens.weight), 1, dims=0) * 10)
    model.save_pretrained(str(folder))
    return folder


def _unit_embeddings(table: torch.Tensor) -> torch.Tensor:
    return table / table.norm(dim=-1, keepdim=True).clamp_min(1e-6)  # the padding row is zero


def counting_draft_tensors(target: Path, config: dict) -> dict:
    """A draft that guesses the counting target's token after next: it reads the first aux layer's input (near the
    embedding of the position's token x) and its head scores x + 2; attention and MLP write nothing. Its vocabulary is
    the target's, permuted (draft id i is target id (i + 5) % V), so d2t is exercised."""
    from safetensors.torch import load_file

    table = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    hidden = config["hidden_size"]
    tensors = random_tensors(config)
    fc = torch.zeros(hidden, 3 * hidden)
    fc[:, :hidden] = torch.eye(hidden)
    target_ids = (torch.arange(VOCAB) + 5) % VOCAB
    tensors.update(
        {
            "fc.weight": fc,
            "midlayer.self_attn.o_proj.weight": torch.zeros_like(tensors["midlayer.self_attn.o_proj.weight"]),
            "midlayer.mlp.down_proj.weight": torch.zeros_like(tensors["midlayer.mlp.down_proj.weight"]),
            "norm.weight": torch.ones(hidden),
            "lm_head.weight": _unit_embeddings(table)[(target_ids - 2) % VOCAB] * 10,
            **vocabulary_maps(target_ids, VOCAB),
        }
    )
    return tensors


@pytest.fixture(scope="session")
def counting_target(tmp_path_factory) -> Path:
    return build_counting_target(tmp_path_factory.mktemp("counting-target"))


@pytest.fixture(scope="session")
def random_draft(tmp_path_factory, counting_target) -> Path:
    """Random weights in the format, the target's embedding (none stored), aux layers 1, 2, 3."""
    config = draft_config(target_config(counting_target), eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYERS})
    return write_draft(tmp_path_factory.mktemp("random-draft"), config, random_tensors(config, seed=1))


@pytest.fixture(scope="session")
def counting_draft(tmp_path_factory, counting_target) -> Path:
    return write_counting_draft(tmp_path_factory.mktemp("counting-draft"), counting_target)


def write_counting_draft(folder: Path, target: Path) -> Path:
    """The counting target's draft (counting_draft_tensors) written at `folder`, aux layers AUX_LAYERS."""
    config = draft_config(
        target_config(target), draft_vocab_size=VOCAB, eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYERS}
    )
    return write_draft(folder, config, counting_draft_tensors(target, config))


_LLMS: dict = {}


@pytest.fixture(scope="session")
def make_llm(counting_target):
    """LLM(counting_target, **options), once per option set."""

    def make(**options) -> LLM:
        key = repr(sorted((k, str(v)) for k, v in options.items()))
        if key not in _LLMS:
            _LLMS[key] = LLM(counting_target, progress=False, **options)
        return _LLMS[key]

    return make


PROMPTS = [
    [5, 6, 7, 8, 9, 10, 11],
    [20, 21],
    list(range(30, 70)),
    [3] * 10,
    [100, 7, 250, 31, 31, 9, 64, 65, 66],
    [318, 319, 4],
    list(range(200, 233, 2)),
]


@pytest.fixture(scope="session")
def plain_tokens(make_llm) -> list[list[int]]:
    llm = make_llm()
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


def _tokens(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, params)]


def _gain(llm: LLM, call) -> tuple[int, int]:
    """(proposed, accepted) tokens while `call` ran."""
    before = llm.stats()
    call()
    after = llm.stats()
    return after.spec_draft_tokens - before.spec_draft_tokens, after.spec_accepted_tokens - before.spec_accepted_tokens


# -- resolution --------------------------------------------------------------------------------------------------
def test_the_draft_is_built_from_the_draft_model_slot(make_llm, counting_draft):
    """kernelbay-llama's EAGLE-3 head fills `draft_model` / EAGLE3LlamaForCausalLM, and serves the draft folder."""
    from kernelbay import resolve
    from kernelbay_engine.speculative.eagle import EagleProposer
    from kernelbay_llama.eagle3 import EAGLE3LlamaForCausalLM

    assert resolve("draft_model", "EAGLE3LlamaForCausalLM") is EAGLE3LlamaForCausalLM
    proposer = make_llm(speculative=counting_draft)._core.proposer
    assert isinstance(proposer, EagleProposer) and type(proposer.draft) is EAGLE3LlamaForCausalLM
    assert proposer.aux.layer_ids == tuple(AUX_LAYERS)


def test_the_drafts_linears_are_packed_as_the_targets(make_llm, counting_draft, plain_tokens):
    """prepack_weights applies to the draft too: "always" packs every linear of it, "never" none; same tokens."""
    from kernelbay_engine.layers.linear import Linear
    from kernelbay_engine.layers.prepack import _PrepackedMethod

    for policy, packed in (("always", True), ("never", False)):
        llm = make_llm(speculative=counting_draft, prepack_weights=policy)
        draft = llm._core.proposer.draft
        methods = [m.method for m in draft.modules() if isinstance(m, Linear)]
        assert methods and all(isinstance(m, _PrepackedMethod) == packed for m in methods), (policy, methods)
        assert _tokens(llm) == plain_tokens


@pytest.fixture
def replaced_draft_slot():
    """An external EAGLE3LlamaForCausalLM (a subclass that counts its proposals), unregistered afterwards."""
    from kernelbay import register_draft_model, registry, resolve

    builtin = resolve("draft_model", "EAGLE3LlamaForCausalLM")

    @register_draft_model("EAGLE3LlamaForCausalLM")
    class CountingHead(builtin):  # type: ignore[misc,valid-type]
        calls = 0

        def draft_logits(self, output):
            type(self).calls += 1
            return super().draft_logits(output)

    yield CountingHead
    registry.unregister_provider(__name__)


def test_an_external_draft_class_takes_the_slot(replaced_draft_slot, counting_target, counting_draft, plain_tokens):
    """A plugin's registration of EAGLE3LlamaForCausalLM displaces the built-in one: LLM builds and runs it."""
    llm = LLM(counting_target, progress=False, speculative=counting_draft)
    assert type(llm._core.proposer.draft) is replaced_draft_slot
    assert _tokens(llm) == plain_tokens and replaced_draft_slot.calls > 0


# -- the draft's guesses, against the format computed by hand ---------------------------------------------------------
def reference_guesses(target: Path, draft: Path, prompt: list[int], first: int, count: int) -> list[int]:
    """The guesses of the draft after prompt + [first], from the format's description alone: transformers' hidden states
    of the target (hidden_states[l] is layer l's input), the draft's safetensors, plain torch. Row i pairs the token
    after position i with the aux hidden states at i; each later guess feeds the previous row's output back."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    config = json.loads((draft / "config.json").read_text())
    w = load_file(str(draft / "model.safetensors"))
    hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    with torch.no_grad():
        states = hf(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    aux = torch.cat([states[i][0] for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]], dim=-1)
    table = w.get("embed_tokens.weight", hf.model.embed_tokens.weight.detach())
    heads, kv_heads, eps = config["num_attention_heads"], config["num_key_value_heads"], config["rms_norm_eps"]
    dim = config["hidden_size"] // heads
    inv_freq = 1.0 / config["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim)
    cache: dict[str, list[torch.Tensor]] = {"k": [], "v": [], "pos": []}

    def rms(x, name):
        return w[name] * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def rope(x, positions):
        angles = positions[:, None].float() * inv_freq[None, :]
        cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]
        return x * cos + torch.cat([-x[..., dim // 2 :], x[..., : dim // 2]], -1) * sin

    def rows(tokens: list[int], hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        m = len(tokens)
        layer = "midlayer."
        x = torch.cat(
            [rms(table[tokens], layer + "input_layernorm.weight"), rms(hidden, layer + "hidden_norm.weight")], -1
        )
        q, k, v = (x @ w[f"{layer}self_attn.{p}_proj.weight"].T for p in "qkv")
        q, k = rope(q.view(m, heads, dim), positions), rope(k.view(m, kv_heads, dim), positions)
        cache["k"].append(k), cache["v"].append(v.view(m, kv_heads, dim)), cache["pos"].append(positions)
        keys, values = (torch.cat(cache[n]).repeat_interleave(heads // kv_heads, dim=1) for n in "kv")
        scores = torch.einsum("mhd,nhd->hmn", q, keys) / dim**0.5
        scores = scores.masked_fill(~(torch.cat(cache["pos"])[None, :] <= positions[:, None]), float("-inf"))
        out = torch.einsum("hmn,nhd->mhd", scores.softmax(-1), values).reshape(m, -1)
        residual = rms(hidden, layer + "hidden_norm.weight") if config.get("norm_before_residual") else hidden
        h1 = residual + out @ w[layer + "self_attn.o_proj.weight"].T
        y = rms(h1, layer + "post_attention_layernorm.weight")
        gate, up = y @ w[layer + "mlp.gate_proj.weight"].T, y @ w[layer + "mlp.up_proj.weight"].T
        return h1 + (torch.nn.functional.silu(gate) * up) @ w[layer + "mlp.down_proj.weight"].T

    sequence = [*prompt, first]
    out = rows(sequence[1:], aux @ w["fc.weight"].T, torch.arange(len(prompt)))[-1:]
    guesses, position = [], len(prompt) - 1
    for _ in range(count):
        draft_id = int((rms(out, "norm.weight") @ w["lm_head.weight"].T).argmax())
        guesses.append(draft_id + int(w["d2t"][draft_id]))
        position += 1
        out = rows([guesses[-1]], out, torch.tensor([position]))
    return guesses


@pytest.mark.parametrize(
    ("own_embedding", "extra"),
    [(False, {}), (True, {}), (False, {"norm_before_residual": True})],
    ids=["target-embedding", "own-embedding", "norm-before-residual"],
)
def test_first_guesses_follow_the_format(counting_target, tmp_path, monkeypatch, own_embedding, extra):
    """The engine's first guesses for a prompt (after prefill and one sampled token) are the ones computed by hand
    from the format with transformers' hidden states: the aux layers, the token shift, fc, the layer, d2t (and
    speculators' `norm_before_residual` variant)."""
    config = draft_config(
        target_config(counting_target), eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYERS}, **extra
    )
    draft = write_draft(tmp_path / "draft", config, random_tensors(config, seed=7, embedding=own_embedding))
    proposals = _recorded_proposals(monkeypatch)
    prompt = PROMPTS[4]
    llm = LLM(counting_target, progress=False, speculative=draft, num_speculative_tokens=3)
    first = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0].token_ids[0]
    assert proposals and proposals[0] == reference_guesses(counting_target, draft, prompt, first, 3)


# -- greedy equals plain decoding ----------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_tokens_equal_plain_decoding_with_a_random_draft(make_llm, random_draft, plain_tokens, k):
    """A random draft's guesses are (nearly) all rejected: every verification rolls back, tokens stay plain."""
    llm = make_llm(speculative=random_draft, num_speculative_tokens=k)
    proposed, _ = _gain(llm, lambda: _check(_tokens(llm), plain_tokens))
    assert proposed > 0


def _check(got, expected) -> None:
    assert got == expected


def test_a_draft_derived_from_the_target_gets_its_guesses_accepted(make_llm, counting_draft, plain_tokens):
    """The counting draft's first guess is the target's own next token wherever the target counts: with k = 1
    most guesses are accepted; with k = 4 each verification keeps at least that one on average."""
    one = make_llm(speculative=counting_draft, num_speculative_tokens=1)
    proposed, accepted = _gain(one, lambda: _check(_tokens(one), plain_tokens))
    assert accepted > 0.5 * proposed, (accepted, proposed)
    four = make_llm(speculative=counting_draft, num_speculative_tokens=4)
    before = four.stats()
    _check(_tokens(four), plain_tokens)
    stats = four.stats()
    assert stats.spec_accepted_tokens - before.spec_accepted_tokens > 0.5 * (
        stats.spec_verifications - before.spec_verifications
    )


def test_a_transformers_fallback_target_feeds_the_draft(make_llm, counting_draft):
    """model_impl="transformers": the hooks read the residual stream entering transformers' own decoder layers; the
    guesses are accepted and the tokens are the fallback's plain ones."""
    plain = make_llm(model_impl="transformers")
    llm = make_llm(model_impl="transformers", speculative=counting_draft, num_speculative_tokens=1)
    proposed, accepted = _gain(llm, lambda: _check(_tokens(llm), _tokens(plain)))
    assert accepted > 0.5 * proposed


def test_chunked_prefill_beside_verifying_decodes_keeps_tokens(make_llm, counting_draft, plain_tokens):
    """An 8-token step budget: prompts are prefilled in chunks (the draft ingests each chunk's hidden states) beside
    requests verifying guesses; tokens stay plain and guesses are accepted."""
    llm = make_llm(speculative=counting_draft, num_speculative_tokens=3, max_num_batched_tokens=8)
    _, accepted = _gain(llm, lambda: _check(_tokens(llm), plain_tokens))
    assert accepted > 0


def test_preemption_rebuilds_the_draft_state(make_llm, counting_draft, plain_tokens, monkeypatch):
    """A cache of 20 blocks of 4 tokens for seven requests: preempted requests are recomputed from their tokens, and
    their draft caches rebuilt from the recomputation; tokens stay plain, guesses keep being accepted."""
    bytes_per_token = make_llm().runner.bytes_per_block // 16
    llm = make_llm(speculative=counting_draft, kv_cache_memory=bytes_per_token * 4 * 20, block_size=4)
    preempted = []
    original = Scheduler._preempt
    monkeypatch.setattr(
        Scheduler, "_preempt", lambda self, r, plan: (preempted.append(r.request_id), original(self, r, plan))
    )
    _, accepted = _gain(llm, lambda: _check(_tokens(llm), plain_tokens))
    assert preempted, "the cache was meant to force a preemption"
    assert accepted > 0


def test_follow_up_requests_equal_their_solo_output(make_llm, counting_draft, plain_tokens):
    """After a speculative batch, requests reusing the freed blocks, the prefix cache and the request ids' slots get
    their solo plain tokens: reversed, one at a time, and prompts extended by their own output."""
    llm = make_llm(speculative=counting_draft, num_speculative_tokens=4, block_size=4)
    first = _tokens(llm)
    _check(_tokens(llm, PROMPTS[::-1]), plain_tokens[::-1])
    _check([_tokens(llm, [p])[0] for p in PROMPTS[:3]], plain_tokens[:3])
    extended = [p + out for p, out in zip(PROMPTS, first, strict=True)][:3]
    plain = make_llm()
    _check(_tokens(llm, extended), [_tokens(plain, [p])[0] for p in extended])
    assert llm._core.proposer._states == {}, "finished requests' draft caches were meant to be released"


def _recorded_proposals(monkeypatch) -> list[list[int]]:
    """Every non-empty proposal list the EAGLE proposer returns from now on, in order."""
    from kernelbay_engine.speculative.eagle import EagleProposer

    proposals: list[list[int]] = []
    original = EagleProposer.propose_requests

    def record(self, requests, limits):
        got = original(self, requests, limits)
        proposals.extend(p for p in got if p)
        return got

    monkeypatch.setattr(EagleProposer, "propose_requests", record)
    return proposals


def test_a_prompt_on_a_cached_prefix_gets_the_same_guesses(make_llm, random_draft, monkeypatch):
    """The same 40-token prompt twice: the second time the target computes only its last block (prefix cache) and
    the draft starts from the rows saved when the first request finished: the same guesses, step by step (a
    random draft's guesses depend on its whole context)."""
    llm = make_llm(speculative=random_draft, num_speculative_tokens=3, block_size=4)
    proposals = _recorded_proposals(monkeypatch)
    runs = []
    for _ in range(2):
        hits = llm.stats().prefix_cache_hits
        tokens = _tokens(llm, [PROMPTS[2]])
        runs.append((tokens, list(proposals)))
        proposals.clear()
    assert llm.stats().prefix_cache_hits > hits, "the second prompt was meant to start on a cached prefix"
    assert runs[0][1] and runs[1] == runs[0]


def test_saved_draft_prefixes_are_bounded_least_recently_used_first():
    """Past its token budget the store drops the draft rows saved longest ago, with every hash that found them."""
    from kernelbay_engine.speculative.eagle import _DraftCache, _SavedPrefixes

    def state(length: int) -> _DraftCache:
        cache = _DraftCache()
        cache.append(torch.randn(length, 2, 8), torch.randn(length, 2, 8), torch.arange(length))
        cache.block_aux = {p: torch.randn(12) for p in range(3, length, 4)}
        return cache

    store = _SavedPrefixes(max_tokens=20, block_size=4)
    store.save([b"a0", b"a1", b"a2"], state(12))  # rows 0..10 kept, found by a0, a1, a2
    store.save([b"b0", b"b1"], state(9))  # rows 0..6: 18 tokens in all
    restored = _DraftCache()
    store.restore([b"a0", b"a1"], 8, restored)
    assert restored.length == 7 and restored.pending_start == 7 and restored.pending is not None
    store.save([b"c0", b"c1"], state(8))  # 25 tokens: the least recently used (b) goes
    store.restore([b"b0"], 4, dropped := _DraftCache())
    store.restore([b"a0"], 4, kept := _DraftCache())
    assert dropped.length == 0 and dropped.pending is None and kept.length == 3


def test_a_closed_stream_releases_its_draft_caches(tokenized_counting_target, counting_draft, plain_tokens):
    """Closing a stream mid-way aborts its requests: their draft caches go at once; the next call is unaffected."""
    llm = LLM(tokenized_counting_target, progress=False, speculative=counting_draft, num_speculative_tokens=2)
    stream = llm.stream(PROMPTS, GREEDY)
    next(stream), next(stream)
    assert llm._core.proposer._states, "the running requests were meant to hold draft caches"
    stream.close()
    assert llm._core.proposer._states == {}
    _check(_tokens(llm), plain_tokens)


def test_stop_strings_max_tokens_and_logprobs_as_plain(make_llm, counting_draft):
    """max_tokens, logprobs and EOS (not ignored) behave as in plain decoding with a draft."""
    plain, spec = make_llm(), make_llm(speculative=counting_draft, num_speculative_tokens=3)
    for params in (
        SamplingParams(max_tokens=7, temperature=0, logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=40, temperature=0),
    ):
        ours, theirs = spec.generate(PROMPTS, params), plain.generate(PROMPTS, params)
        for a, b in zip(ours, theirs, strict=True):
            assert (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason)
            if params.logprobs is not None:
                assert a.logprobs is not None and b.logprobs is not None
                for x, y in zip(a.logprobs, b.logprobs, strict=True):
                    assert x.keys() == y.keys() and all(abs(x[t] - y[t]) < 1e-4 for t in x)


# -- sampling ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def six_token_target(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("six-token-llama-4-layers")
    return build_tiny_llama(folder, seed=3, vocab_size=6, num_hidden_layers=4, initializer_range=0.05)


def test_seeded_sampling_with_a_draft_follows_the_plain_distribution(six_token_target, tmp_path):
    """1200 seeded requests, 4 sampled tokens each, on a 6-token target with and without a random draft (3-token draft
    vocabulary, default aux layers 2, 2, 1): every position's marginal agrees (two-sample chi-square, 0.1% level) and
    guesses were accepted and rejected along the way."""
    config = draft_config(target_config(six_token_target))
    draft = write_draft(tmp_path / "draft", config, random_tensors(config, seed=5, scale=0.05))
    assert_sampling_follows_plain_decoding(six_token_target, {"speculative": draft, "num_speculative_tokens": 3})


# -- bad draft folders ---------------------------------------------------------------------------------------------
def _bad_draft(tmp_path: Path, target: Path, *, tensors=None, drop=(), **overrides) -> Path:
    config = draft_config(target_config(target), eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYERS})
    config.update(overrides)
    weights = tensors if tensors is not None else random_tensors(config)
    return write_draft(tmp_path / "draft", config, {k: v for k, v in weights.items() if k not in drop})


@pytest.mark.parametrize(
    ("overrides", "error", "named"),
    [
        ({"vocab_size": 400}, DraftMismatch, "vocab_size is 400 but the target's vocabulary has 320"),
        ({"target_model_type": "qwen3"}, DraftMismatch, "a draft for 'qwen3' models"),
        (
            {"target_hidden_size": 96},
            DraftMismatch,
            r"96 wide \(target_hidden_size\), but the target's hidden_size is 64",
        ),
        (
            {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}},
            DraftMismatch,
            r"target layers \[1, 2, 9\].*has 4 layers",
        ),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}, DraftMismatch, "EAGLE-3 fuses exactly 3"),
    ],
    ids=["vocabulary", "model-type", "hidden-size", "aux-layer-range", "aux-layer-count"],
)
def test_a_draft_config_that_does_not_fit_the_target_is_refused(counting_target, tmp_path, overrides, error, named):
    draft = _bad_draft(tmp_path, counting_target, tensors={}, **overrides)  # refused before any weight is read
    with pytest.raises(error, match=named):
        LLM(counting_target, progress=False, speculative=draft)


def test_the_default_aux_layers_must_exist_in_the_target(tiny_llama, tmp_path):
    """Without eagle_config, a 2-layer target has no layers (2, 1, -1): named, with the default they come from."""
    config = draft_config(target_config(tiny_llama))
    draft = write_draft(tmp_path / "draft", config, {})
    with pytest.raises(DraftMismatch, match=r"target layers \[2, 1, -1\] \(the default\).*has 2 layers"):
        LLM(tiny_llama, progress=False, speculative=draft)


def test_a_model_folder_is_not_a_draft(counting_target):
    with pytest.raises(DraftMismatch, match="not an EAGLE-3 draft"):
        LLM(counting_target, progress=False, speculative=counting_target)


def test_a_draft_for_an_unknown_draft_architecture_is_unsupported(counting_target, tmp_path):
    """`Eagle3DeepseekV3ForCausalLM` resolves the draft slot EAGLE3DeepseekV3ForCausalLM, which no plugin fills."""
    from kernelbay.errors import UnsupportedArchitecture

    draft = _bad_draft(tmp_path, counting_target, architectures=["Eagle3DeepseekV3ForCausalLM"])
    with pytest.raises(UnsupportedArchitecture, match="EAGLE3DeepseekV3ForCausalLM"):
        LLM(counting_target, progress=False, speculative=draft)


def test_missing_d2t_and_a_short_t2d_are_named(counting_target, tmp_path):
    with pytest.raises(MissingWeights, match="no d2t tensor"):
        LLM(counting_target, progress=False, speculative=_bad_draft(tmp_path / "a", counting_target, drop=("d2t",)))
    config = draft_config(target_config(counting_target), eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYERS})
    tensors = random_tensors(config)
    tensors["t2d"] = tensors["t2d"][:300]
    with pytest.raises(DraftMismatch, match="t2d has 300 entries but the vocabulary has 320"):
        LLM(counting_target, progress=False, speculative=_bad_draft(tmp_path / "b", counting_target, tensors=tensors))


def test_d2t_outside_the_vocabulary_is_refused(counting_target, tmp_path):
    config = draft_config(target_config(counting_target), eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYERS})
    tensors = random_tensors(config)
    tensors["d2t"][-1] = VOCAB
    with pytest.raises(DraftMismatch, match=r"d2t maps draft ids to target ids outside \[0, 320\)"):
        LLM(counting_target, progress=False, speculative=_bad_draft(tmp_path, counting_target, tensors=tensors))


def test_a_missing_layer_tensor_is_missing_weights(counting_target, tmp_path):
    draft = _bad_draft(tmp_path, counting_target, drop=("midlayer.hidden_norm.weight",))
    with pytest.raises(MissingWeights, match=r"midlayer\.hidden_norm\.weight"):
        LLM(counting_target, progress=False, speculative=draft)


def test_a_draft_folder_that_does_not_exist_is_named(counting_target):
    """(A draft at tensor_parallel_size=2 works: test_speculative_tensor_parallel.py.)"""
    with pytest.raises(EngineArgumentError, match=r"'ngram' .* or an EAGLE-3 draft folder; got 'no/such/draft'"):
        LLM(counting_target, progress=False, speculative="no/such/draft")


# -- the command line ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tokenized_counting_target(tmp_path_factory, counting_target) -> Path:
    """The counting target with a tokenizer (for text prompts on the command line)."""
    from .checkpoints import train_tokenizer

    folder = tmp_path_factory.mktemp("counting-target-text")
    for file in counting_target.iterdir():
        shutil.copy(file, folder / file.name)
    train_tokenizer(folder)
    return folder


def test_run_speculative_dir_prints_the_plain_text(tokenized_counting_target, counting_draft, capsys):
    """`kernelbay run MODEL --speculative DRAFT --stats`: plain decoding's text, the acceptance on stderr; a bad draft
    folder is exit 14."""
    from kernelbay.cli import main

    base = ["run", str(tokenized_counting_target), "--prompt", "the quick brown", "--max-tokens", "16", "--raw"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main([*base, "--speculative", str(counting_draft), "--num-speculative-tokens", "2", "--stats"]) == 0
    captured = capsys.readouterr()
    assert captured.out == plain and "speculative acceptance rate: " in captured.err
    assert main([*base, "--speculative", str(tokenized_counting_target)]) == 14
    assert "not an EAGLE-3 draft" in capsys.readouterr().err


def test_stop_strings_and_streaming_with_a_draft_as_plain(tokenized_counting_target, counting_draft):
    """Text prompts with stop strings, generated and streamed, with the counting draft: every field as plain
    decoding's (a stop string completed mid-way through accepted guesses drops the tokens after it)."""
    plain = LLM(tokenized_counting_target, progress=False)
    spec = LLM(tokenized_counting_target, progress=False, speculative=counting_draft, num_speculative_tokens=4)
    texts = ["the quick brown fox", "a fortune cookie says", "kernelbay runs models", "greedy"]
    reference = plain.generate(texts, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    stops = tuple(o.text[len(o.text) // 2 :][:3] for o in reference if len(o.text) > 6)
    for params in (
        SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop=stops),
        SamplingParams(max_tokens=30, temperature=0, stop=stops[:1]),
    ):
        ours, theirs = spec.generate(texts, params), plain.generate(texts, params)
        assert [(o.text, o.token_ids, o.finish_reason) for o in ours] == [
            (o.text, o.token_ids, o.finish_reason) for o in theirs
        ]
        assert any(o.finish_reason == "stop" and len(o.token_ids) < 30 for o in ours), (
            "a stop string was meant to end one"
        )
        streamed = {}
        for delta in spec.stream(texts, params):
            streamed.setdefault(delta.index, []).append(delta.text)
        assert ["".join(streamed[i]) for i in range(len(texts))] == [o.text for o in theirs]
    assert spec.stats().spec_accepted_tokens > 0


# -- explain -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(p.name for p in SHARED.glob("eagle3-draft-*")))
def test_every_vendored_eagle3_config_explains(name, capsys):
    """Each vendored draft config explains: the slot, the draft vocabulary, the target layers it reads (its own or
    the default), its parameters; the JSON document validates against docs/explain.schema.json."""
    from kernelbay.cli import main

    folder = SHARED / name
    assert main(["explain", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["resolution"] == {"kind": "draft_model", "name": "EAGLE3LlamaForCausalLM"}
    section = doc["sections"]["draft"]
    raw = json.loads((folder / "config.json").read_text())
    assert section["draft_vocab_size"] == raw["draft_vocab_size"] and section["vocab_size"] == raw["vocab_size"]
    declared = raw.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
    assert section["aux_layer_ids"] == declared
    assert section["parameters"] > 0 and section["target_hidden_size"] == raw["hidden_size"]
    head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    assert section["kv_bytes_per_token"] == 2 * raw["num_key_value_heads"] * head_dim * 4
    _validate(doc)
    assert main(["explain", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "draft        EAGLE-3 head" in text and f"{raw['draft_vocab_size']:,}-token draft vocabulary" in text


def _validate(doc: dict) -> None:
    import jsonschema

    schema = json.loads((SHARED.parents[2] / "docs" / "explain.schema.json").read_text())
    jsonschema.validate(doc, schema)


def test_explain_names_a_drafts_target_model_type_and_own_embedding(counting_draft, tmp_path, capsys):
    """A folder with weights: whether the draft keeps its own embedding; target_model_type when the config says it."""
    from kernelbay.cli import main

    config = json.loads((counting_draft / "config.json").read_text()) | {"target_model_type": "llama"}
    folder = write_draft(tmp_path / "d", config, random_tensors(config, embedding=True))
    assert main(["explain", str(folder), "--json"]) == 0
    section = json.loads(capsys.readouterr().out)["sections"]["draft"]
    assert section["target_model_type"] == "llama" and section["embedding"] == "own"
    assert section["aux_layer_ids"] == AUX_LAYERS
    assert main(["explain", str(counting_draft), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sections"]["draft"]["embedding"] == "target"


@pytest.mark.parametrize("ids", ["x", -1, [], [1, "a", 2], [1, True, 2], [0, -2, 1], {"layers": [1, 2, 3]}])
def test_malformed_aux_layer_ids_are_a_config_error_naming_the_field(ids, tmp_path, capsys):
    """A draft config whose eagle_aux_hidden_state_layer_ids is no list of layer indices: explain (and run, which
    reads the same field) fail with a one-line config error naming it, not a traceback (the config fuzzer's case)."""
    from kernelbay.cli import main

    raw = json.loads((SHARED / "eagle3-draft-llama3-8b-eagle3" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw | {"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}))
    assert main(["explain", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "eagle_config.eagle_aux_hidden_state_layer_ids must be a list of target layer indices" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_an_eagle_config_that_is_no_object_is_a_config_error(tmp_path, capsys):
    from kernelbay.cli import main

    raw = json.loads((SHARED / "eagle3-draft-llama3-8b-eagle3" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw | {"eagle_config": 5}))
    assert main(["explain", str(tmp_path)]) == 1
    assert "eagle_config must be an object" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("target_model_type", 0),
        ("target_model_type", ""),
        ("target_hidden_size", "x"),
        ("target_hidden_size", 0),
        ("target_hidden_size", 2.5),
    ],
)
def test_malformed_target_fields_are_a_config_error_naming_them(field, value, tmp_path, capsys):
    """target_model_type / target_hidden_size of the wrong type: a one-line config error naming the field (found by
    the config fuzzer: explain wrote a document the schema refuses, or raised ValueError)."""
    from kernelbay.cli import main

    raw = json.loads((SHARED / "eagle3-draft-llama3-8b-eagle3" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw | {field: value}))
    assert main(["explain", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{field} must" in err and len(err.strip().splitlines()) == 1, err
