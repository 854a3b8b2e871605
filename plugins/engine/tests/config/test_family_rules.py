"""Family rules come through one hook: used with provenance, ranked like slots, failures name their plugin."""

from __future__ import annotations

import pytest

from kernelbay.attention import LayerKind
from kernelbay.errors import ConfigError, PluginImportError, RegistrationConflict
from kernelbay.hooks import hookimpl
from kernelbay_engine.config import ConfigRuleError, LayerPlan, ModelConfig
from tests._paths import REAL_CONFIGS as SHARED_CONFIGS

from .test_errors import tiny

FULL, SLIDING = LayerKind.FULL, LayerKind.SLIDING

GEMMA2 = dict(
    model_type="gemma2", architectures=["Gemma2ForCausalLM"], num_hidden_layers=4, head_dim=16, sliding_window=8
)


class RulePlugin:
    """A hook plugin registered at runtime (external: it has no distribution)."""

    def __init__(self, model_types, **rules):
        self.model_types, self.rules = model_types, rules

    @hookimpl
    def register_model_type_rules(self, register):
        register(self.model_types, **self.rules)


def all_full(config) -> LayerPlan:
    return LayerPlan((FULL,) * config.num_hidden_layers)


def resolve(write_config, **changes) -> ModelConfig:
    return ModelConfig.from_pretrained(write_config(tiny(**changes)))


def test_runtime_rule_is_used_and_noted(hook_env, write_config):
    """A rule for a model_type no built-in plugin covers decides that point, and the notes say whose it was."""
    hook_env().register(RulePlugin("mistral", layers=lambda c: LayerPlan((SLIDING, FULL))), name="acme")
    cfg = resolve(write_config, model_type="mistral", sliding_window=8)
    assert cfg.layer_types == (SLIDING, FULL) and cfg.sliding_window == 8  # the window from the generic field
    assert any(n.startswith("layers: the 'mistral' rule of acme") for n in cfg.notes), cfg.notes


def test_external_rule_displaces_the_builtin_one(hook_env, write_config):
    """An external plugin's gemma2 rule wins over kernelbay-llama's, which the note names as displaced."""
    hook_env().register(RulePlugin("gemma2", layers=all_full), name="acme")
    cfg = resolve(write_config, **GEMMA2)
    assert cfg.layer_types == (FULL,) * 4
    assert any("rule of acme" in n and "over kernelbay_llama.config_rules" in n for n in cfg.notes), cfg.notes


def test_builtin_rule_applies_alone(hook_env, write_config):
    """Without a contender, kernelbay-llama's Gemma-2 alternation applies and is attributed to it."""
    hook_env()
    cfg = resolve(write_config, **GEMMA2)
    assert cfg.layer_types == (SLIDING, FULL, SLIDING, FULL)
    assert any("'gemma2' rule of kernelbay_llama.config_rules (kernelbay-llama" in n for n in cfg.notes)


def test_two_external_rules_conflict_until_one_is_preferred(hook_env, write_config):
    """Two external rules for one point are a conflict naming both; KERNELBAY_PREFER picks one."""
    pm = hook_env()
    pm.register(RulePlugin("gemma2", layers=all_full), name="acme")
    pm.register(RulePlugin("gemma2", layers=lambda c: None), name="other")
    with pytest.raises(RegistrationConflict, match=r"(?s)layers rule for model_type 'gemma2'.*acme.*other"):
        resolve(write_config, **GEMMA2)
    pm = hook_env(KERNELBAY_PREFER="gemma2=acme")
    pm.register(RulePlugin("gemma2", layers=all_full), name="acme")
    pm.register(RulePlugin("gemma2", layers=lambda c: None), name="other")
    assert resolve(write_config, **GEMMA2).layer_types == (FULL,) * 4


def test_rule_returning_none_leaves_the_generic_fields(hook_env, write_config):
    """A Gemma-2 config that writes its layer_types: the family rule defers and the written kinds stand."""
    hook_env()
    cfg = resolve(write_config, **GEMMA2, layer_types=[FULL, FULL, SLIDING, SLIDING])
    assert cfg.layer_types == (FULL, FULL, SLIDING, SLIDING)
    assert not any("rule of" in n for n in cfg.notes)


def test_rule_that_raises_names_its_plugin(hook_env, write_config):
    """A crashing rule is a ConfigRuleError naming the rule, the model_type and the plugin."""

    def crash(config):
        raise RuntimeError("boom")

    hook_env().register(RulePlugin("mistral", intermediate_size=crash), name="acme")
    with pytest.raises(
        ConfigRuleError,
        match=r"rule raised RuntimeError: boom \[the intermediate_size rule for "
        r"model_type 'mistral' of acme",
    ):
        resolve(write_config, model_type="mistral")


@pytest.mark.parametrize(
    "answer, expected",
    [
        ([FULL, FULL], "rule returned .* not LayerPlan or None"),
        (LayerPlan((FULL,)), "rule gave 1 layer kinds for num_hidden_layers=2"),
    ],
)
def test_rule_with_a_wrong_answer_names_its_plugin(hook_env, write_config, answer, expected):
    """An answer of the wrong type or length is the plugin's fault, and the error says whose."""
    hook_env().register(RulePlugin("mistral", layers=lambda c: answer), name="acme")
    with pytest.raises(ConfigRuleError, match=expected + r".*of acme"):
        resolve(write_config, model_type="mistral")


def test_refusing_rule_keeps_its_reason_and_names_its_plugin(hook_env, write_config):
    """kernelbay-llama's Nemotron-NAS rule refuses a short block_configs: its reason, its source, its plugin."""
    hook_env()
    folder = write_config(
        tiny(
            model_type="nemotron-nas",
            architectures=["DeciLMForCausalLM"],
            block_configs=[],
            num_key_value_heads=None,
            intermediate_size=None,
        )
    )
    with pytest.raises(
        ConfigRuleError,
        match=r"config.json: block_configs must list one block per layer \(2\)\. "
        r"\[the layers rule .*kernelbay-llama 0.1.0, built-in",
    ):
        ModelConfig.from_pretrained(folder)


def test_unknown_rule_point_is_refused_with_the_plugin_and_close_matches(hook_env, write_config):
    """register(..., layer=...) fails when the hook runs, naming the plugin and the point it meant."""
    hook_env().register(RulePlugin("mistral", layer=all_full), name="acme")
    with pytest.raises(
        PluginImportError,
        match=r"plugin 'acme' raised ConfigError: .*rule point: 'layer'.*"
        r"Did you mean: layers",
    ):
        resolve(write_config, model_type="mistral")


# ---- without the family plugin: the generic fields only ------------------------------------------
def test_gemma2_without_kernelbay_llama_takes_the_class_layer_types(hook_env, write_config):
    """No kernelbay-llama: a Gemma-2 config's kinds are the layer_types transformers' Gemma2Config computes."""
    hook_env(KERNELBAY_DISABLE_PLUGINS="kernelbay-llama")
    cfg = resolve(write_config, **GEMMA2)
    assert cfg.layer_types == (SLIDING, FULL, SLIDING, FULL) == tuple(cfg.hf_config.layer_types)
    assert not any("rule of" in n for n in cfg.notes)


def test_without_the_family_plugin_an_unwritten_family_default_is_an_error(hook_env):
    """No kernelbay-gpt: GPT-2's implicit 4 x hidden FFN is unknown to the core, which says what is missing."""
    hook_env(KERNELBAY_DISABLE_PLUGINS="kernelbay-gpt")
    with pytest.raises(ConfigError, match=r"'intermediate_size' / .*'n_inner' is missing"):
        ModelConfig.from_pretrained(SHARED_CONFIGS / "gpt2")


MLA_TINY = dict(
    model_type="deepseek_v3", kv_lora_rank=32, q_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8
)


@pytest.mark.parametrize(
    "answer, expected",
    [
        ({"q_lora": 8}, r"rule sets unknown MLASpec field\(s\) q_lora"),
        ({"q_lora_rank": 0}, r"MLA q_lora_rank must be a positive int or None, got 0"),
    ],
)
def test_dict_rule_setting_what_its_record_refuses_names_its_plugin(hook_env, write_config, answer, expected):
    """A dict answer (mla, moe, rope) sets record fields: an unknown field or a value the record refuses is the
    rule's fault, said with its point and plugin."""
    hook_env().register(RulePlugin("deepseek_v3", mla=lambda c: answer), name="acme")
    with pytest.raises(ConfigRuleError, match=expected + r".*\[the mla rule for model_type 'deepseek_v3' of acme"):
        resolve(write_config, **MLA_TINY)


def test_dict_rule_sets_the_fields_it_names(hook_env, write_config):
    """An external rope rule displaces none (no built-in one for llama) and sets only the field it answers."""
    hook_env().register(RulePlugin("llama", rope=lambda c: {"local_theta": 500.0}), name="acme")
    rope = resolve(write_config).rope
    assert (rope.local_theta, rope.rope_type) == (500.0, "default")


def test_without_the_family_plugin_legacy_kv_flags_are_an_error_not_mha(hook_env):
    """No kernelbay-gpt: Falcon-40B's new_decoder_architecture (and multi_query) are named, not read as MHA."""
    hook_env(KERNELBAY_DISABLE_PLUGINS="kernelbay-gpt")
    with pytest.raises(ConfigError, match=r"KV heads are given by .*new_decoder_architecture=true.*kernelbay-gpt"):
        ModelConfig.from_pretrained(SHARED_CONFIGS / "falcon-40b-instruct")


def test_without_the_family_plugin_a_dropped_q_lora_rank_is_an_error_not_the_class_default(hook_env):
    """No kernelbay-deepseek (which reads the weights): V2-Lite's copy without q_lora_rank is refused by name,
    never given transformers' 1536."""
    hook_env(KERNELBAY_DISABLE_PLUGINS="kernelbay-deepseek")
    with pytest.raises(ConfigError, match=r"'q_lora_rank' is missing .*kernelbay-deepseek.*1536"):
        ModelConfig.from_pretrained(SHARED_CONFIGS / "deepseek-v2-lite-chat")
