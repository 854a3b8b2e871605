"""Family rules: what a model_type's configs leave implicit, supplied by the family's plugin.

One door, the `register_model_type_rules` hook (a `kernelbay.hooks` module)::

    @hookimpl
    def register_model_type_rules(register):
        register("gemma2", layers=gemma2_layers)   # gemma2_layers(config: ConfigView) -> LayerPlan | None

The engine asks the rule first; None leaves the point to the generic fields. Rules rank like registry slots
(per model_type and point): external displaces built-in, two externals conflict unless KERNELBAY_PREFER picks.
"""

from __future__ import annotations

import dataclasses
from numbers import Real

from kernelbay.errors import ConfigError, RegistrationConflict, unknown_name_message
from kernelbay.hooks import hookspec

from . import _geometry as geo
from ._fields import Fields
from ._layers import LayerPlan
from ._records import frozen_json
from ._rope import rope_parameters

HOOK = "register_model_type_rules"
# Rule point -> the type its answer has (or None); every rule is `rule(config: ConfigView)`.
RULE_POINTS: dict[str, type] = {
    "architecture": str,  # the slot name to resolve instead of architectures[0] (a legacy name)
    "layers": LayerPlan,  # each layer's attention kind; window, chunk, KV heads, block-sparse geometry
    "intermediate_size": int,  # the dense FFN width (the widest, when layers differ)
    "attention_scale": Real,  # the softmax scale applied to q·k
    "position_embedding": str,  # "rope" | "alibi" | "learned"
    "gated_ffn": bool,  # False: the FFN is up/down only (GPT-2, OPT, NeoX, Falcon), not gate/up/down
    "attention_sinks": bool,  # every attention layer has per-head sink logits (GPT-OSS)
    "moe": dict,  # MoEConfig fields the config leaves implicit ({"bias": True} for GPT-OSS's expert biases)
    "mla": dict,  # MLASpec fields the config leaves implicit (DeepSeek: a dropped q_lora_rank, from the weights)
    "rope": dict,  # RopeConfig fields the config leaves implicit (Gemma 3: local_theta, its sliding layers' base)
    "not_built": str,  # why the family reads these configs but builds no model (said when none serves them)
}


class FamilyRuleHooks:
    """The hook this package calls (declared with `kernelbay.hooks.declare_hooks` before each call)."""

    @hookspec
    def register_model_type_rules(self, register):
        """Call `register(model_types, **rules)`: how configs of those model_types resolve what config.json
        leaves implicit (rule points: `kernelbay_engine.config.RULE_POINTS`)."""


class ConfigRuleError(ConfigError):
    """A family rule failed or refused the config; the message names the rule's plugin."""


class ConfigView(Fields):
    """What a rule reads: config.json's keys over transformers' parse (read-only copies: dicts and lists frozen),
    the core's sizes, and `note()`; `get`, `written`, `get_int`, `get_float`, `get_bool`, `required_int` as on
    the core's own reader."""

    def __init__(self, fields: Fields, model_type: str):
        super().__init__(frozen_json(fields.raw), frozen_json(fields.parsed), fields.source, fields.folder)
        self.notes = fields.notes  # a rule's notes are the config's
        self._fields = fields  # whose stored tensors (headers read once) the rule sees
        self.model_type = model_type

    hidden_size = property(lambda self: self.required_int(*geo.HIDDEN))
    num_hidden_layers = property(lambda self: self.required_int(*geo.LAYERS))
    num_attention_heads = property(lambda self: self.required_int(*geo.HEADS))
    rope_parameters = property(lambda self: rope_parameters(self), doc="the RoPE dict as written, or {}")
    tensors = property(lambda self: self._fields.tensors, doc="the folder's stored tensors: name -> (dtype, shape)")

    def note(self, text: str) -> None:
        """Say how a quirk was resolved (`kernelbay explain` prints the notes)."""
        self.notes.append(text)


def family_rules(f: Fields, model_type: str) -> FamilyRules:
    """The winning rule of each point for `model_type`, from every plugin's `register_model_type_rules`."""
    from kernelbay.hooks import call_hook, declare_hooks, hook_provider
    from kernelbay.registry import Registration

    claims: dict[str, list[Registration]] = {}  # point -> every plugin's rule, as claims on a registry slot

    def make_register(plugin: str):
        def register(model_types, **rules) -> None:
            if model_type in _checked(model_types, rules):
                for point, rule in rules.items():
                    claims.setdefault(point, []).append(Registration(point, model_type, rule, hook_provider(plugin)))

        return register

    declare_hooks(FamilyRuleHooks)
    call_hook(HOOK, make_register)
    return FamilyRules(ConfigView(f, model_type), {point: _slot(point, model_type, c) for point, c in claims.items()})


def _checked(model_types, rules: dict) -> tuple[str, ...]:
    types = (model_types,) if isinstance(model_types, str) else tuple(model_types)
    if not types or not all(isinstance(t, str) and t for t in types):
        raise ConfigError(f"register() takes model_type names first, got {model_types!r}.")
    if not rules:
        raise ConfigError(f"register() names no rule; give one of {', '.join(RULE_POINTS)} as a keyword.")
    for point, rule in rules.items():
        if point not in RULE_POINTS:
            raise ConfigError(unknown_name_message("rule point", point, RULE_POINTS))
        if not callable(rule):
            raise ConfigError(f"the {point} rule must be callable as rule(config), got {rule!r}.")
    return types


def _slot(point: str, model_type: str, claims: list):
    from kernelbay.registry import Preferences, decide, default_registry

    prefer = default_registry().export_providers()["prefer"] if len(claims) > 1 else {}
    slot = decide(point, model_type, claims, Preferences(prefer))
    if slot.conflict:
        who = " and ".join(r.provider.describe() for r in slot.conflict)
        raise RegistrationConflict(
            f"the {point} rule for model_type {model_type!r} is given by {who}; choose one "
            f'with KERNELBAY_PREFER="{model_type}=<distribution>".'
        )
    return slot


class FamilyRules:
    """The rules installed plugins give one model_type, bound to the config they answer for."""

    def __init__(self, view: ConfigView, slots: dict):
        self._view = view
        self._slots = slots

    def ask(self, point: str, *, note: bool = True):
        """The rule's answer for `point`, or None where no rule answers (the engine then decides); `note`: say in
        the config's notes whose rule it was (not for an answer only an error may use)."""
        slot = self._slots.get(point)
        if slot is None:
            return None
        try:
            answer = slot.winner.target(self._view)
        except Exception as exc:  # any failure of a plugin's rule is reported with its name
            what = str(exc) if isinstance(exc, ConfigError) else f"rule raised {type(exc).__name__}: {exc}"
            raise self._error(point, slot, what) from exc
        if answer is not None:
            self._check(point, slot, answer)
        if answer is not None and note:
            over = "".join(f", over {r.provider.describe()}" for r in slot.displaced)
            self._view.note(f"{point}: the {self._view.model_type!r} rule of {slot.winner.provider.describe()}{over}")
        return answer

    def apply(self, point: str, record, answer: dict | None):
        """`record` with the fields the `point` rule's `answer` (a dict: `moe`, `mla`, `rope`) sets."""
        if not answer:
            return record
        slot = self._slots[point]
        unknown = sorted(set(answer) - set(record.__dataclass_fields__))
        if unknown:
            raise self._error(point, slot, f"rule sets unknown {type(record).__name__} field(s) {', '.join(unknown)}")
        try:
            return dataclasses.replace(record, **answer)
        except ValueError as err:  # the record refuses the value: the rule's fault, said with its name
            raise self._error(point, slot, str(err)) from None

    def _check(self, point: str, slot, answer) -> None:
        wanted = RULE_POINTS[point]
        if (isinstance(answer, bool) and wanted is not bool) or not isinstance(answer, wanted):
            raise self._error(point, slot, f"rule returned {answer!r}, not {wanted.__name__} or None")
        if isinstance(answer, LayerPlan) and len(answer.kinds) != self._view.num_hidden_layers:
            raise self._error(
                point,
                slot,
                f"rule gave {len(answer.kinds)} layer kinds for num_hidden_layers={self._view.num_hidden_layers}",
            )

    def _error(self, point: str, slot, what: str) -> ConfigRuleError:
        where = "" if what.startswith(self._view.source) else f"{self._view.source}: "
        return ConfigRuleError(
            f"{where}{what} [the {point} rule for model_type {self._view.model_type!r} of "
            f"{slot.winner.provider.describe()}]"
        )
