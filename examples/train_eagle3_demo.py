"""Train a small EAGLE-3 draft head for kernelbay's embedded demo model, and measure how often it is right.

    python examples/train_eagle3_demo.py --out plugins/engine/kernelbay_engine/demo/eagle3
    python examples/train_eagle3_demo.py --evaluate plugins/engine/kernelbay_engine/demo/eagle3

Steps, all local (no model hub):
1. read the same fortunes corpus as the demo model (`make_demo_checkpoint.py`'s functions: Debian's
   `fortunes` packages via `apt-get download`) and the same held-out split, tokenized by the demo's tokenizer;
2. draft vocabulary: the `--draft-vocab-size` most frequent tokens of the training text, as the `d2t` / `t2d`
   maps of the EAGLE-3 format;
3. train one EAGLE-3 decoder layer (fusion `fc` of three target hidden states, attention over
   `[norm(embedding), hidden_norm(hidden)]`, SiLU MLP, own norm and LM head over the draft vocabulary) to the
   target's own next-token distribution restricted to the draft vocabulary, on batches of corpus windows and
   of the target's own greedy continuations of training-fortune prompts. Target hidden states and logits
   come from transformers' `LlamaForCausalLM` on the demo folder in float32, once per batch, without grad.
   Each batch is unrolled `--ttt-steps` times ("training-time test"): step 0 is teacher-forced on the target's
   hidden states; step j > 0 feeds the draft's own pre-norm output of step j - 1 as the hidden input and the
   next true token as the token input, at positions shifted by j, attending to the step-0 keys of the
   earlier rows and to its own row's keys of steps 1..j -- exactly what the draft sees when it proposes j + 1
   tokens at inference;
4. write the draft folder (`config.json` with `architectures: ["LlamaForCausalLMEagle3"]` and explicit
   `eagle_config.eagle_aux_hidden_state_layer_ids`, `model.safetensors` without `embed_tokens` -- the
   target's embedding is used --, README, licence), then `--evaluate` it: greedy k-token proposals against
   the target's greedy tokens on held-out fortunes, with transformers only.

Same seed, steps and thread count give the same weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
import time
from pathlib import Path
from typing import cast

import torch
from make_demo_checkpoint import DEBIAN_VERSION, encode_stream, fetch_packages, load_corpus, split_held_out
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

DEMO_DIR = Path(__file__).resolve().parents[1] / "plugins/engine/kernelbay_engine/demo"
LOSS_DECAY = 0.8  # weight of TTT step j is LOSS_DECAY**j, as in EAGLE-3 / SpecForge
KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per draft step: keys, values [B, kv_heads, T, head_dim]


# --- settings ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class DraftSettings:
    """What to train and how long; the defaults take ~7 minutes on one (shared) CPU core."""

    draft_vocab_size: int = 1024
    aux_layers: tuple[int, int, int] = (1, 2, 3)  # target layers whose INPUT residual stream the draft reads
    ttt_steps: int = 4  # unrolled training-time-test steps (the k the draft is trained for)
    generated_rows: int = 4  # rows of each batch taken from the target's own greedy continuations
    generated_prompts: int = 512  # training fortunes whose first 8 tokens the target continues greedily
    steps: int = 600
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 3e-3
    warmup: int = 40
    seed: int = 0
    threads: int = 1
    minutes: float = 30.0  # wall-time cap; hitting it ends training early (and breaks determinism)

    def __post_init__(self):
        for name in ("draft_vocab_size", "ttt_steps", "steps", "batch_size", "seq_len", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.generated_rows <= self.batch_size:
            raise ValueError(f"--generated-rows must be in [0, --batch-size], got {self.generated_rows}")
        if self.seq_len <= self.ttt_steps + 1:
            raise ValueError(f"--seq-len {self.seq_len} must exceed --ttt-steps + 1 ({self.ttt_steps + 1})")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"--warmup must be in [0, --steps), got {self.warmup} with {self.steps} steps")
        if not 0 < self.lr < 1:
            raise ValueError(f"--lr must be in (0, 1), got {self.lr}")


@dataclasses.dataclass(frozen=True, slots=True)
class DraftGeometry:
    """The draft layer's shape: everything config.json says about it."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    aux_layers: tuple[int, ...]

    def config(self, target_config: dict) -> dict:
        """config.json of the draft folder (the EAGLE-3 format SpecForge writes and vLLM reads)."""
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": target_config["max_position_embeddings"],
            "tie_word_embeddings": False,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.hidden_size,
            "bos_token_id": target_config["bos_token_id"],
            "eos_token_id": target_config["eos_token_id"],
            "pad_token_id": target_config["pad_token_id"],
            "torch_dtype": "bfloat16",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers)},
        }

    @classmethod
    def from_config(cls, config: dict) -> DraftGeometry:
        return cls(
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_heads=config["num_attention_heads"],
            num_kv_heads=config["num_key_value_heads"],
            head_dim=config["head_dim"],
            vocab_size=config["vocab_size"],
            draft_vocab_size=config["draft_vocab_size"],
            rms_norm_eps=config["rms_norm_eps"],
            rope_theta=config["rope_theta"],
            aux_layers=tuple(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
        )


def demo_geometry(target: LlamaForCausalLM, settings: DraftSettings) -> DraftGeometry:
    """The target's own layer shape, with the draft vocabulary and aux layers of the settings."""
    config = target.config.to_dict()  # plain values (the config object types them all Optional)
    if max(settings.aux_layers) >= config["num_hidden_layers"]:
        raise ValueError(f"--aux-layers must be < the target's {config['num_hidden_layers']} layers")
    return DraftGeometry.from_config(
        {
            **config,
            "draft_vocab_size": settings.draft_vocab_size,
            "rope_theta": config["rope_parameters"]["rope_theta"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(settings.aux_layers)},
        }
    )


# --- draft vocabulary --------------------------------------------------------------------


def draft_vocabulary(stream: torch.Tensor, vocab_size: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) for the `size` most frequent tokens of the stream (ties: lower id first).

    d2t: int64 (size,), target_id = draft_id + d2t[draft_id]; t2d: bool (vocab_size,).
    """
    counts = torch.bincount(stream, minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda t: (-int(counts[t]), t))
    chosen = torch.tensor(sorted(order[:size]), dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[chosen] = True
    return chosen - torch.arange(size), t2d


# --- the draft model ---------------------------------------------------------------------


class Attention(nn.Module):
    """GQA attention over the 2 * hidden concatenated input; q_proj/k_proj/v_proj/o_proj, no biases."""

    def __init__(self, g: DraftGeometry):
        super().__init__()
        self.g = g
        self.q_proj = nn.Linear(2 * g.hidden_size, g.num_heads * g.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * g.hidden_size, g.num_kv_heads * g.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * g.hidden_size, g.num_kv_heads * g.head_dim, bias=False)
        self.o_proj = nn.Linear(g.num_heads * g.head_dim, g.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """x: [B, T, 2H]; positions: [T]. Appends this step's (k, v) [B, Hkv, T, D] to cache.

        cache[0] holds the teacher-forced step's keys (causal over rows); cache[s] for s >= 1 the keys of
        unrolled step s, which row i sees only for itself (its own chain of proposals).
        """
        b, t, _ = x.shape
        g = self.g
        q = self.q_proj(x).view(b, t, g.num_heads, g.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, g.num_kv_heads, g.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, g.num_kv_heads, g.head_dim).transpose(1, 2)
        cos, sin = rope(positions, g.head_dim, g.rope_theta)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        cache.append((k, v))
        out = ttt_attention(q, cache, g.num_heads // g.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, g.num_heads * g.head_dim))


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's rotary tables (rotate-half layout) for the given positions; each [T, head_dim]."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def ttt_attention(q: torch.Tensor, cache: KVCache, groups: int) -> torch.Tensor:
    """Softmax over [causal step-0 keys of rows <= i] + [row i's own keys of steps 1..j]; q: [B, H, T, D]."""
    scale = q.shape[-1] ** -0.5
    k0, v0 = (x.repeat_interleave(groups, dim=1) for x in cache[0])
    t = q.shape[2]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    scores = [(q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
    scores += [(q * k.repeat_interleave(groups, dim=1)).sum(-1, keepdim=True) * scale for k, _ in cache[1:]]
    weights = torch.cat(scores, dim=-1).softmax(dim=-1)
    out = weights[..., :t] @ v0
    for s, (_, v) in enumerate(cache[1:]):
        out = out + weights[..., t + s : t + s + 1] * v.repeat_interleave(groups, dim=1)
    return out


class MLP(nn.Module):
    def __init__(self, g: DraftGeometry):
        super().__init__()
        self.gate_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.up_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.down_proj = nn.Linear(g.intermediate_size, g.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """The one EAGLE-3 layer; its residual stream is the hidden input (fused target state or own output)."""

    def __init__(self, g: DraftGeometry):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(g.hidden_size, eps=g.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(g.hidden_size, eps=g.rms_norm_eps)
        self.self_attn = Attention(g)
        self.post_attention_layernorm = nn.RMSNorm(g.hidden_size, eps=g.rms_norm_eps)
        self.mlp = MLP(g)

    def forward(self, embeds, hidden, positions, cache):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        h1 = hidden + self.self_attn(x, positions, cache)
        return h1 + self.mlp(self.post_attention_layernorm(h1))


class DraftHead(nn.Module):
    """fc + midlayer + norm + lm_head, with d2t / t2d buffers: state_dict names are the format's."""

    d2t: torch.Tensor  # int64 [draft_vocab_size]
    t2d: torch.Tensor  # bool [vocab_size]

    def __init__(self, g: DraftGeometry):
        super().__init__()
        self.geometry = g
        self.fc = nn.Linear(len(g.aux_layers) * g.hidden_size, g.hidden_size, bias=False)
        self.midlayer = DecoderLayer(g)
        self.norm = nn.RMSNorm(g.hidden_size, eps=g.rms_norm_eps)
        self.lm_head = nn.Linear(g.hidden_size, g.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(g.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(g.vocab_size, dtype=torch.bool))

    def step(self, embeds, hidden, positions, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: (pre-norm output h2 [B, T, H], draft-vocabulary logits [B, T, draft_vocab])."""
        h2 = self.midlayer(embeds, hidden, positions, cache)
        return h2, self.lm_head(self.norm(h2))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def load_draft(folder: Path) -> DraftHead:
    """A draft folder read back (weights cast to float32)."""
    config = json.loads((folder / "config.json").read_text())
    draft = DraftHead(DraftGeometry.from_config(config))
    weights = load_file(folder / "model.safetensors")
    draft.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()})
    return draft.eval()


# --- target ------------------------------------------------------------------------------


def load_target(folder: Path) -> LlamaForCausalLM:
    target = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    target.requires_grad_(False)
    return target


@torch.no_grad()
def target_features(
    target: LlamaForCausalLM, ids: torch.Tensor, aux_layers: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux [B, T, 3H]: residual stream at the input of each aux layer, logits [B, T, V]) for ids [B, T]."""
    out = target(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[layer] for layer in aux_layers], dim=-1), out.logits


# --- training ----------------------------------------------------------------------------


def shifted(x: torch.Tensor, by: int, fill: float | int = 0) -> torch.Tensor:
    """x[:, by:] padded at the end to x's length along dim 1."""
    pad = x.new_full((x.shape[0], by, *x.shape[2:]), fill)
    return torch.cat([x[:, by:], pad], dim=1)


def ttt_loss(
    draft: DraftHead, embed: nn.Module, ids: torch.Tensor, aux: torch.Tensor, logits: torch.Tensor, steps: int
) -> tuple[torch.Tensor, list[float]]:
    """Weighted distillation loss over `steps` unrolled steps, and each step's top-1 agreement with the target.

    Row i of step j reads token ids[i + 1 + j] at position i + j and is trained toward the target's
    distribution at position i + 1 + j restricted to the draft vocabulary, where the target's argmax lies in
    the draft vocabulary (other rows cannot be right and are masked, as SpecForge does).
    """
    t = ids.shape[1]
    rows = torch.arange(t)
    with torch.no_grad():
        target_p = logits[:, 1:, draft.t2d].softmax(-1)  # row i's teacher at step 0 is position i + 1
        argmax = logits[:, 1:].argmax(-1)
        in_vocab = draft.t2d[argmax]
    hidden, cache = draft.fc(aux), cast(KVCache, [])
    total, agreement = torch.zeros(()), []
    for j in range(steps):
        hidden, draft_logits = draft.step(embed(shifted(ids, 1 + j)), hidden, rows + j, cache)
        n = t - 1 - j  # rows whose token and teacher exist in the window
        valid = in_vocab[:, j:]
        per_row = F.cross_entropy(
            draft_logits[:, :n].transpose(1, 2), target_p[:, j:].transpose(1, 2), reduction="none"
        )
        total = total + LOSS_DECAY**j * per_row[valid].mean()
        with torch.no_grad():
            hits = draft.to_target(draft_logits[:, :n].argmax(-1)) == argmax[:, j:]
            agreement.append(hits[valid].float().mean().item())
    return total, agreement


def lr_at(step: int, settings: DraftSettings) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def init_draft(target: LlamaForCausalLM, g: DraftGeometry, d2t: torch.Tensor, t2d: torch.Tensor) -> DraftHead:
    """Seeded init; lm_head starts from the target's (tied) output rows of the draft vocabulary."""
    draft = DraftHead(g)
    for module in draft.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
    with torch.no_grad():
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight[t2d])
        draft.norm.weight.copy_(target.model.norm.weight)
    return draft


def self_distillation_rows(target: LlamaForCausalLM, stream: torch.Tensor, settings: DraftSettings) -> torch.Tensor:
    """[N, seq_len]: the first 8 tokens of training fortunes continued greedily by the target.

    The draft proposes along the target's own greedy text at inference; corpus windows alone under-represent
    it (a 3M-parameter model's greedy text loops on its favourite phrases).
    """
    prompt_len = 8
    prompts = fortune_prompts(stream, target.config.to_dict()["bos_token_id"], prompt_len, settings.generated_prompts)
    chunks = [greedy_continuations(target, chunk, settings.seq_len - prompt_len) for chunk in prompts.split(64)]
    return torch.cat(chunks)


def train(
    target: LlamaForCausalLM, draft: DraftHead, stream: torch.Tensor, settings: DraftSettings
) -> tuple[list[float], float]:
    """AdamW on batches of random corpus windows plus generated rows; returns per-step losses and seconds."""
    gen = torch.Generator().manual_seed(settings.seed)
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    embed = target.get_input_embeddings()
    started = time.monotonic()
    generated = self_distillation_rows(target, stream, settings) if settings.generated_rows else None
    print(f"{0 if generated is None else len(generated)} generated rows in {time.monotonic() - started:.0f} s")
    corpus_rows = settings.batch_size - settings.generated_rows
    losses: list[float] = []
    agreements: list[list[float]] = []
    draft.train()
    for step in range(settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, settings)
        starts = torch.randint(0, len(stream) - settings.seq_len, (corpus_rows,), generator=gen)
        ids = torch.stack([stream[s : s + settings.seq_len] for s in starts.tolist()])
        if generated is not None:
            picks = torch.randint(0, len(generated), (settings.generated_rows,), generator=gen)
            ids = torch.cat([ids, generated[picks]])
        aux, logits = target_features(target, ids, settings.aux_layers)
        loss, agreement = ttt_loss(draft, embed, ids, aux, logits, settings.ttt_steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(loss.item())
        agreements.append(agreement)
        if (step + 1) % 25 == 0 or step + 1 == settings.steps:
            recent = agreements[-25:]
            per_step = " ".join(f"{sum(a[j] for a in recent) / len(recent):.2f}" for j in range(settings.ttt_steps))
            print(
                f"step {step + 1:4d}/{settings.steps}  loss {sum(losses[-25:]) / len(losses[-25:]):.3f}  "
                f"top-1 agreement per TTT step {per_step}  {time.monotonic() - started:5.0f} s",
                flush=True,
            )
        if time.monotonic() - started > settings.minutes * 60:
            print(f"warning: --minutes {settings.minutes} ended training at step {step + 1}; not reproducible")
            break
    return losses, time.monotonic() - started


# --- evaluation --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Acceptance:
    """Speculative decoding simulated on target-greedy continuations of held-out prompts."""

    k: int
    proposed: int
    accepted: int
    verifications: int
    per_position: tuple[float, ...]  # P(proposal j accepted | proposals < j accepted), j = 1..k
    greedy_in_draft_vocab: float  # share of the target's greedy tokens the draft vocabulary holds

    @property
    def rate(self) -> float:
        return self.accepted / self.proposed

    @property
    def mean_length(self) -> float:
        """Tokens a verification step gains, the target's own included (plain decoding: 1.0)."""
        return (self.accepted + self.verifications) / self.verifications


@torch.no_grad()
def greedy_continuations(target: LlamaForCausalLM, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """prompts [B, P] extended by the target's argmax token new_tokens times (EOS not special); [B, P + new]."""
    out = target(input_ids=prompts, use_cache=True)
    tokens = [out.logits[:, -1:].argmax(-1)]
    for _ in range(new_tokens - 1):
        out = target(input_ids=tokens[-1], cache=out.cache, use_cache=True)
        tokens.append(out.logits[:, -1:].argmax(-1))
    return torch.cat([prompts, *tokens], dim=1)


@torch.no_grad()
def proposals(draft: DraftHead, embed: nn.Module, ids: torch.Tensor, aux: torch.Tensor, k: int) -> torch.Tensor:
    """[B, T, k] target ids the draft proposes at every row in one pass.

    Row p is the state after the target produced ids[p + 1] from position p: proposal 1 comes from
    (embed(ids[p + 1]), aux[p]), proposal j + 1 from (embed(proposal j), own h2) at position p + j, its
    context the teacher-forced rows <= p -- the inference-time chain, for every p at once.
    """
    t = ids.shape[1]
    rows = torch.arange(t)
    hidden, cache = draft.fc(aux), cast(KVCache, [])
    tokens = shifted(ids, 1)
    out = []
    for j in range(k):
        hidden, logits = draft.step(embed(tokens), hidden, rows + j, cache)
        tokens = draft.to_target(logits.argmax(-1))
        out.append(tokens)
    return torch.stack(out, dim=-1)


def simulate(ids: torch.Tensor, proposed: torch.Tensor, prompt_len: int, k: int) -> tuple[int, int, list[int]]:
    """(accepted, verifications, accepted-at-position counts) of speculative decoding along each row."""
    accepted = verifications = 0
    at_position = [0] * (k + 1)  # at_position[j]: verifications that reached proposal j
    for row in range(ids.shape[0]):
        p = prompt_len - 1
        while p + 1 + k < ids.shape[1]:
            a = 0
            while a < k and int(proposed[row, p, a]) == int(ids[row, p + 2 + a]):
                a += 1
            for j in range(min(a + 1, k)):
                at_position[j] += 1
            accepted, verifications = accepted + a, verifications + 1
            at_position[k] += a == k
            p += a + 1
    return accepted, verifications, at_position


def fortune_prompts(stream: torch.Tensor, bos: int, prompt_len: int, limit: int) -> torch.Tensor:
    """The first prompt_len tokens of the first `limit` fortunes of the stream (those at least that long)."""
    starts = (stream == bos).nonzero().flatten().tolist()
    prompts = [stream[s : s + prompt_len] for s in starts if s + prompt_len <= len(stream)]
    prompts = [p for p in prompts if int((p == bos).sum()) == 1][:limit]
    return torch.stack(prompts)


def evaluate(target: LlamaForCausalLM, draft: DraftHead, val_stream: torch.Tensor, args) -> Acceptance:
    """Greedy k-token proposals against the target's greedy continuations of held-out fortune prompts."""
    prompts = fortune_prompts(val_stream, target.config.to_dict()["bos_token_id"], args.prompt_len, args.eval_prompts)
    ids = greedy_continuations(target, prompts, args.new_tokens)
    aux, _ = target_features(target, ids, draft.geometry.aux_layers)
    proposed = proposals(draft, target.get_input_embeddings(), ids, aux, args.k)
    accepted, verifications, at_position = simulate(ids, proposed, args.prompt_len, args.k)
    per_position = tuple(at_position[j + 1] / at_position[j] if at_position[j] else 0.0 for j in range(args.k))
    generated = ids[:, args.prompt_len :]
    in_vocab = draft.t2d[generated].float().mean().item()
    return Acceptance(args.k, verifications * args.k, accepted, verifications, per_position, in_vocab)


def describe(result: Acceptance) -> str:
    per_position = ", ".join(f"{p:.2f}" for p in result.per_position)
    return (
        f"k={result.k}: acceptance {result.rate:.3f} ({result.accepted}/{result.proposed} proposals), "
        f"mean accepted length {result.mean_length:.2f} tokens per verification, "
        f"conditional acceptance by position [{per_position}], "
        f"target greedy tokens in the draft vocabulary {result.greedy_in_draft_vocab:.3f}"
    )


# --- writing the folder ------------------------------------------------------------------

README_TEMPLATE = """\
# EAGLE-3 draft for the kernelbay demo checkpoint

A one-layer EAGLE-3 draft head (`LlamaForCausalLMEagle3`, {params:,} parameters without the embedding:
hidden {hidden}, {heads} query / {kv_heads} KV heads of size {head_dim}, MLP {intermediate}, weights stored in
bfloat16) for the demo model one folder up. It reads the target's residual stream at the input of decoder
layers {aux_layers} (`eagle_config.eagle_aux_hidden_state_layer_ids`), uses the target's token embedding
(no `embed_tokens.weight` here), and predicts over a draft vocabulary of the {draft_vocab:,} most frequent
tokens of the training text (`d2t`: target id = draft id + d2t[draft id]; `t2d`: which target ids are in it),
which hold {corpus_coverage:.1%} of the training tokens. Made by `examples/train_eagle3_demo.py` so that
`LLM(speculative=DRAFT_DIR)` has a real, trained draft to measure; it is only as good as this tiny target.

    from kernelbay_engine import LLM
    from kernelbay_engine.inputs import demo_model_folder

    llm = LLM(speculative=str(demo_model_folder() / "eagle3"), num_speculative_tokens=4)

## Corpus and licence

The demo model's training fortunes (Debian `fortunes-min` / `fortunes` `{version}`, read and split exactly as
`examples/make_demo_checkpoint.py` does, held-out fortunes excluded), tokenized by the demo's tokenizer. The
packages' copyright file, reproduced in `LICENSE.fortunes`, puts them under the BSD licence of the Regents of
the University of California (the advertising clause deleted); these weights are derived from that text and
the demo model, and are distributed under the same terms.

## Training

Distillation to the target's own next-token distribution restricted to the draft vocabulary (target hidden
states and logits from transformers' `LlamaForCausalLM` on the demo folder, float32), with {ttt_steps} unrolled
training-time-test steps (loss weights 0.8^j; step j > 0 feeds the draft's own output back as its hidden
input). Each batch holds {corpus_rows} random windows of the training text and {generated_rows} of the target's own
greedy continuations of the first 8 tokens of {generated_prompts} training fortunes (the draft proposes along the
target's greedy text at inference). {steps} steps of AdamW (batch {batch} x {seq_len} tokens, peak lr {lr}, cosine
decay, seed {seed},
{threads} CPU thread(s)) in {minutes:.1f} minutes of wall time; loss {loss_first:.2f} at the start,
{loss_last:.2f} at the end (mean of the last 25 steps).

## Acceptance (transformers reference loop, these stored weights)

Greedy proposals of k tokens checked against the target's greedy tokens, along {prompts} held-out fortune
prompts of {prompt_len} tokens continued greedily by the target for {new_tokens} tokens:

    {result}

## Rebuild / re-measure

    python examples/train_eagle3_demo.py --out plugins/engine/kernelbay_engine/demo/eagle3
    python examples/train_eagle3_demo.py --evaluate plugins/engine/kernelbay_engine/demo/eagle3

Same seed, steps and thread count give the same weights (see `--help`).
"""


def write_folder(out: Path, draft: DraftHead, target: LlamaForCausalLM, copyright_text: str) -> None:
    """config.json, model.safetensors (float weights in bfloat16, d2t int64, t2d bool), LICENSE.fortunes."""
    out.mkdir(parents=True, exist_ok=True)
    config = draft.geometry.config(target.config.to_dict())
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tensors = {
        name: (t.detach().to(torch.bfloat16) if t.is_floating_point() else t.detach()).contiguous()
        for name, t in draft.state_dict().items()
    }
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "LICENSE.fortunes").write_text(copyright_text, encoding="utf-8")


def write_readme(out: Path, args, draft: DraftHead, losses: list[float], seconds: float, **facts) -> None:
    settings = draft_settings(args)
    g = draft.geometry
    readme = README_TEMPLATE.format(
        params=sum(p.numel() for p in draft.parameters()),
        hidden=g.hidden_size,
        heads=g.num_heads,
        kv_heads=g.num_kv_heads,
        head_dim=g.head_dim,
        intermediate=g.intermediate_size,
        aux_layers=list(g.aux_layers),
        draft_vocab=g.draft_vocab_size,
        version=args.debian_version,
        ttt_steps=settings.ttt_steps,
        steps=len(losses),
        batch=settings.batch_size,
        corpus_rows=settings.batch_size - settings.generated_rows,
        generated_rows=settings.generated_rows,
        generated_prompts=settings.generated_prompts,
        seq_len=settings.seq_len,
        lr=settings.lr,
        seed=settings.seed,
        threads=settings.threads,
        minutes=seconds / 60,
        loss_first=losses[0],
        loss_last=sum(losses[-25:]) / len(losses[-25:]),
        prompts=args.eval_prompts,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        **facts,
    )
    (out / "README.md").write_text(readme, encoding="utf-8")


# --- main --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--out", type=Path, help="train a draft and write its folder here")
    action.add_argument("--evaluate", type=Path, metavar="DRAFT_DIR", help="only measure an existing draft folder")
    parser.add_argument("--target", type=Path, default=DEMO_DIR, help="the demo model folder")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "kernelbay-demo-cache")
    parser.add_argument("--debian-version", default=DEBIAN_VERSION, help="version of fortunes/fortunes-min")
    parser.add_argument("--k", type=int, default=4, help="proposals per verification in the evaluation")
    parser.add_argument("--eval-prompts", type=int, default=64, help="held-out fortunes to evaluate on")
    parser.add_argument("--prompt-len", type=int, default=8, help="tokens of each held-out fortune used as prompt")
    parser.add_argument("--new-tokens", type=int, default=56, help="greedy target tokens after each prompt")
    defaults = DraftSettings()
    for field in dataclasses.fields(DraftSettings):
        value = getattr(defaults, field.name)
        flag = f"--{field.name.replace('_', '-')}"
        if isinstance(value, tuple):
            parser.add_argument(flag, type=int, nargs=len(value), default=list(value))
        else:
            parser.add_argument(flag, type=type(value), default=value)
    return parser.parse_args(argv)


def draft_settings(args: argparse.Namespace) -> DraftSettings:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(DraftSettings)}
    values["aux_layers"] = tuple(values["aux_layers"])
    return DraftSettings(**values)


def build(args: argparse.Namespace) -> None:
    settings = draft_settings(args)
    torch.set_num_threads(settings.threads)
    corpus = load_corpus(fetch_packages(args.cache_dir, args.debian_version))
    train_texts, val_texts = split_held_out(corpus.fortunes, seed=0)  # the demo model's own split
    tokenizer = cast(PreTrainedTokenizerFast, AutoTokenizer.from_pretrained(args.target))
    stream, val_stream = encode_stream(tokenizer, train_texts), encode_stream(tokenizer, val_texts)
    target = load_target(args.target)
    if args.evaluate:
        print(describe(evaluate(target, load_draft(args.evaluate), val_stream, args)))
        return
    d2t, t2d = draft_vocabulary(stream, target.config.vocab_size, settings.draft_vocab_size)
    coverage = t2d[stream].float().mean().item()
    print(f"draft vocabulary {settings.draft_vocab_size}: {coverage:.1%} of the {len(stream):,} training tokens")
    torch.manual_seed(settings.seed)
    draft = init_draft(target, demo_geometry(target, settings), d2t, t2d)
    losses, seconds = train(target, draft, stream, settings)
    print(f"trained in {seconds / 60:.1f} min")
    write_folder(args.out, draft, target, corpus.copyright)
    result = evaluate(target, load_draft(args.out), val_stream, args)  # the stored (bfloat16) weights
    print(describe(result))
    write_readme(args.out, args, draft, losses, seconds, corpus_coverage=coverage, result=describe(result))
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"wrote {args.out} ({size / 1e6:.1f} MB)")


def main(argv: list[str] | None = None) -> None:
    build(parse_args(argv))


if __name__ == "__main__":
    main()
