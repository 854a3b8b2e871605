"""Mixture-of-experts geometry from config.json: experts, top-k, widths, routing, which layers are MoE.

Generic fields cover Mixtral (num_local_experts), Qwen-MoE (num_experts, decoder_sparse_step, mlp_only_layers,
shared_expert_intermediate_size), DeepSeek (n_routed_experts, first_k_dense_replace, moe_layer_freq, topk_method,
n_shared_experts) and GPT-OSS (swiglu_limit); what a family leaves implicit (GPT-OSS's expert biases) its plugin
says through the "moe" rule point (`register_model_type_rules`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernelbay.errors import ConfigError
from kernelbay.moe import ROUTINGS, canonical_activation

from ._fields import MAX_DIMENSION, Fields, check_size
from ._records import Record

if TYPE_CHECKING:
    from ._rules import FamilyRules

EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
TOP_K = ("num_experts_per_tok", "experts_per_token", "moe_topk")
_TOPK_METHODS = {"noaux_tc": "noaux_tc", "group_limited_greedy": "grouped_topk"}


@dataclass(frozen=True, slots=True)
class MoEConfig(Record):
    """The MoE layers of a model (all share one geometry)."""

    num_experts: int
    top_k: int
    intermediate_size: int  # one routed expert's FFN width
    layers: tuple[bool, ...]  # (num_hidden_layers,) True where the layer's FFN is MoE
    activation: str = "silu"
    routing: str = "softmax_topk"  # see kernelbay.moe.ROUTINGS
    normalize: bool = True  # renormalise the top-k weights to sum to 1
    scaling: float = 1.0  # routed_scaling_factor
    num_groups: int = 1  # grouped routings: expert groups, and how many a token may use
    top_groups: int = 1
    shared_intermediate_size: int = 0  # always-on shared expert width (0: none)
    shared_gate: bool = False  # Qwen2-MoE: the shared expert's output scaled by sigmoid(gate(x))
    bias: bool = False  # expert biases (gate_up and down)
    router_bias: bool = False
    alpha: float | None = None  # swigluoai
    limit: float | None = None

    def __post_init__(self):
        problems = []
        try:
            object.__setattr__(self, "activation", canonical_activation(self.activation))
        except ValueError as err:
            problems.append(f"hidden_act: {err}")
        if self.routing not in ROUTINGS:
            problems.append(f"routing {self.routing!r} is not one of {', '.join(ROUTINGS)}")
        if not 0 < self.num_experts <= MAX_DIMENSION:
            problems.append(f"the expert count {self.num_experts} must be 1 to {MAX_DIMENSION}")
        if not 0 < self.top_k <= self.num_experts:
            problems.append(f"num_experts_per_tok={self.top_k} must be in 1..{self.num_experts} (the experts)")
        if not 0 < self.intermediate_size <= MAX_DIMENSION:
            width = self.intermediate_size
            problems.append(f"the expert width moe_intermediate_size={width} must be 1 to {MAX_DIMENSION}")
        if not 0 <= self.shared_intermediate_size <= MAX_DIMENSION:
            problems.append(f"the shared experts' width {self.shared_intermediate_size} must be 0 to {MAX_DIMENSION}")
        if self.num_experts % self.num_groups or not 0 < self.top_groups <= self.num_groups:
            problems.append(f"n_group={self.num_groups} must divide the experts and topk_group be in 1..n_group")
        if not any(self.layers):
            problems.append("no layer is an MoE layer (check decoder_sparse_step / mlp_only_layers)")
        if problems:
            raise ConfigError("invalid mixture-of-experts config", problems)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.layers)

    def geometry(self, hidden_size: int, expert_format: str = "dense", block_size=None):
        """The `kernelbay.moe.MoEGeometry` a backend is built from."""
        from kernelbay.moe import MoEGeometry

        return MoEGeometry(
            self.num_experts,
            self.top_k,
            hidden_size,
            self.intermediate_size,
            self.activation,
            self.bias,
            self.bias,
            self.alpha,
            self.limit,
            expert_format,
            block_size,
        )

    def derived(self) -> dict:
        return {"layers": [i for i, moe in enumerate(self.layers) if moe]}  # the MoE layers' indices


def resolve_moe(f: Fields, n_layers: int, rules: FamilyRules) -> MoEConfig | None:
    """None for a dense model; the family's "moe" rule may set fields the config leaves implicit."""
    experts = f.get_int(*EXPERTS)
    if experts is None or (experts == 0 and not f.written(*EXPERTS)):  # a config class's dense default
        return None
    key = next(k for layer in (f.raw, f.parsed) for k in EXPERTS if layer.get(k) is not None)  # as f.get finds it
    if experts < 1:
        raise ConfigError(
            f"{f.source}: {key}={experts} is not an expert count (1 to {MAX_DIMENSION}); "
            f"for a dense model remove {key} and the experts per token"
        )
    check_size(f.source, key, experts)
    top_k = f.get_int(*TOP_K)
    if top_k is None:
        raise ConfigError(f"{f.source}: {EXPERTS} is set but the experts per token ({', '.join(TOP_K)}) is not")
    generic = MoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=f.required_int("moe_intermediate_size", "intermediate_size"),
        layers=_moe_layers(f, n_layers),
        routing=_TOPK_METHODS.get(str(f.get("topk_method")), "softmax_topk"),
        normalize=f.get_bool("norm_topk_prob", default=True),
        scaling=f.get_float("routed_scaling_factor", default=1.0),
        num_groups=_at_least(f, "n_group", 1),
        top_groups=_at_least(f, "topk_group", 1),
        shared_intermediate_size=_shared_width(f),
        shared_gate=f.get_int("shared_expert_intermediate_size") is not None,
        **_activation(f),
    )
    return rules.apply("moe", generic, rules.ask("moe"))


def _activation(f: Fields) -> dict:
    if f.written("swiglu_limit"):
        return {
            "activation": "swigluoai",
            "alpha": f.get_float("swiglu_alpha", default=1.702),
            "limit": f.get_float("swiglu_limit"),
        }
    return {"activation": str(f.get("hidden_act", "hidden_activation", default="silu"))}


def _shared_width(f: Fields) -> int:
    width = f.get_int("shared_expert_intermediate_size")
    if width is not None:
        return width
    shared = f.get_int("n_shared_experts") or 0
    if shared < 0:
        raise ConfigError(f"{f.source}: n_shared_experts={shared} must be 0 (no shared expert) or more")
    return shared * (f.get_int("moe_intermediate_size") or 0)


def _moe_layers(f: Fields, n_layers: int) -> tuple[bool, ...]:
    """Qwen: every `decoder_sparse_step`-th layer not in `mlp_only_layers`; DeepSeek: from `first_k_dense_replace`,
    every `moe_layer_freq`-th."""
    step = _at_least(f, "decoder_sparse_step", 1)
    dense = set(f.get("mlp_only_layers", default=()) or ())
    first = _at_least(f, "first_k_dense_replace", 0)
    freq = _at_least(f, "moe_layer_freq", 1)
    return tuple(i not in dense and (i + 1) % step == 0 and i >= first and i % freq == 0 for i in range(n_layers))


def _at_least(f: Fields, name: str, low: int) -> int:
    """A routing or layer-pattern field (`low` when absent or null), refused below `low`: a step of 0 or -1
    would make every layer an MoE layer, a group count of 0 would be read as 1, silently."""
    value = f.get_int(name, default=low)
    if value < low:
        raise ConfigError(f"{f.source}: {name}={value} must be an integer of at least {low}.")
    return value
