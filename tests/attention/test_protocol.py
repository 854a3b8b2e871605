"""The AttentionBackend protocol: construction, forward args, options, cache binding, the Attention layer."""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest
import torch

from kernelbay import resolve
from kernelbay.attention import (
    ANY,
    AttentionBackend,
    AttentionForwardArgs,
    AttentionGeometry,
    AttentionRequirements,
    AttentionType,
    KVCacheSpec,
    create_attention,
)
from kernelbay.errors import ConfigError
from kernelbay_engine.attention import Attention, attention_layers, collect_attention_layers

from ._harness import SPECS, assert_close, make_data, run_backend

MLA = {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "q_lora_rank": None}


def test_capabilities_are_answered_without_an_instance_by_one_method():
    """Declarations are class attributes; `capability_failures(req)` answers a requirements record with them."""
    sdpa = resolve("attention_backend", "SDPA")
    assert 80 in sdpa.head_sizes and "bfloat16" in sdpa.dtypes and "fp8_e4m3" in sdpa.kv_cache_dtypes
    assert sdpa.sliding_window and sdpa.chunked_attention and not sdpa.mla and not sdpa.logit_softcap
    assert sdpa.is_available() == (True, "available")
    req = AttentionRequirements(
        head_size=80,
        dtype="bfloat16",
        kv_cache_dtype="fp8",
        kv_layout="HND",
        block_size=48,
        platform="cpu",
        attn_type="sliding_attention",
    )
    assert sdpa.capability_failures(req) == []
    assert sdpa.capability_failures(replace(req, logit_softcap=True, sparse_mode="dsa")) == [
        "logit_softcap: attention logit soft-capping is not supported",
        "sparse_mode: dsa is not supported (supported: none)",
    ]


def test_capability_defaults_are_conservative(fresh_registry):
    """A backend that declares nothing gets no head size, dtype, block size, layout or platform (cuda included)."""

    class Bare(AttentionBackend):
        name = "BARE"

    req = AttentionRequirements(head_size=64, dtype="float32", block_size=16, kv_layout="NHD", platform="cuda")
    assert Bare.capability_failures(req) == [
        "head_size: 64 is not supported (supported: none declared)",
        "dtype: float32 is not supported (supported: none declared)",
        "block_size: 16 is not supported (supported: none declared)",
        "kv_layout: NHD is not supported (supported: none declared)",
        "platform: cuda is not supported (supported: none declared)",
    ]
    assert Bare.capability_failures(replace(req, kv_cache_dtype="fp8"))[2] == (
        "kv_cache_dtype: fp8_e4m3 is not supported (supported: auto)"
    )


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"dtypes": frozenset({"float64"})}, "dtypes: unknown name"),
        ({"head_sizes": 64}, "head_sizes must be a set of values or ANY"),
        (
            {"block_sizes": (16, 32), "preferred_block_size": 8},
            "preferred_block_size 8 is not among block_sizes 16, 32",
        ),
    ],
)
def test_impossible_declarations_are_refused_when_the_class_is_made(attrs, message):
    """A vendor's typo in a declaration fails at class creation, naming the attribute."""
    with pytest.raises(TypeError, match=message):
        type("Typo", (AttentionBackend,), {"name": "TYPO", **attrs})


def test_mla_accepts_null_q_lora_rank():
    """DeepSeek-V2-Lite geometry (q_lora_rank null) builds; the layer's cache is the latent."""
    layer = create_attention(0, 4, 24, 4, backend="VANILLA", mla=MLA, kv_b_proj=torch.nn.Linear(32, 4 * 32))
    spec = layer.kv_cache_spec("bfloat16")
    assert (spec.mla, spec.num_kv_heads, spec.head_dim, spec.bytes_per_token) == (True, 1, 40, 80)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mla={**MLA, "kv_lora_rank": None}), "MLA geometry is incomplete: missing kv_lora_rank"),
        (dict(mla={**MLA, "qk_rope_head_dim": -1}), "qk_rope_head_dim must be an int >= 0, got -1"),
        (dict(mla={k: v for k, v in MLA.items() if k != "v_head_dim"}), "missing v_head_dim"),
        (dict(mla={**MLA, "qk_nope_head_dim": 8}), "MLA head_dim must be qk_nope_head_dim \\+ qk_rope_head_dim = 16"),
        (dict(mla=MLA, kv_b_proj=None), "an MLA layer needs kv_b_proj"),
    ],
)
def test_mla_geometry_is_validated_at_construction(kwargs, message):
    """Incomplete or inconsistent MLA geometry is a ValueError naming the field."""
    kwargs.setdefault("kv_b_proj", torch.nn.Linear(32, 4 * 32))
    with pytest.raises(ValueError, match=message):
        create_attention(0, 4, 24, 4, backend="VANILLA", **kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=6, num_kv_heads=4), r"num_heads \(6\) must be a multiple of num_kv_heads \(4\)"),
        (dict(attn_type="sliding_attention"), "a sliding_attention layer needs sliding_window >= 1, got None"),
        (dict(attn_type="chunked_attention", chunk_size=0), "needs chunk_size >= 1, got 0"),
        (dict(sliding_window=4), "sliding_window=4 given for a full_attention layer"),
        (dict(attn_type="diagonal"), "unknown attention type 'diagonal'; use one of: full_attention"),
        (dict(logit_softcap=-1.0), "logit_softcap must be > 0 or None"),
    ],
)
def test_bad_geometry_is_a_value_error(kwargs, message):
    """Geometry mistakes are caught when the layer is built, with what to change."""
    args = dict(num_heads=4, num_kv_heads=2) | kwargs
    with pytest.raises(ValueError, match=message):
        create_attention(0, args.pop("num_heads"), 16, args.pop("num_kv_heads"), backend="VANILLA", **args)


def test_chunked_attention_on_an_incapable_backend_is_refused(fresh_registry):
    """A backend without chunked attention refuses a chunked layer instead of attending fully."""
    from kernelbay.attention import AttentionBackend

    class NoChunks(AttentionBackend):
        name = "NOCHUNK"
        head_sizes = ANY

    with pytest.raises(
        ValueError,
        match="attention backend NOCHUNK cannot build layer 3: chunked_attention: chunked attention is not supported",
    ):
        create_attention(3, 4, 16, 2, backend=NoChunks, attn_type="chunked_attention", chunk_size=8)
    with pytest.raises(ValueError, match="logit_softcap: attention logit soft-capping is not supported"):
        create_attention(3, 4, 16, 2, backend="SDPA", logit_softcap=30.0)


def test_forward_args_are_one_typed_record():
    """Options travel in AttentionForwardArgs only: keyword options and other objects are refused."""
    spec = SPECS["small_decode"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'causal'"):
        _forward(spec, causal=True)
    with pytest.raises(TypeError, match="forward_args must be an AttentionForwardArgs, got dict"):
        _forward(spec, forward_args={"causal": False})
    with pytest.raises(TypeError, match="causal must be a bool"):
        AttentionForwardArgs(causal="yes")


def _forward(spec, **kwargs):
    data = make_data(spec)
    cls, layer = resolve("attention_backend", "VANILLA"), create_attention(0, 4, 64, 2, backend="VANILLA")
    layer.attach_kv_cache(layer.kv_cache_spec("float32").allocate(8))
    md = cls.prepare([(1, 0, (0,))], 16)
    return layer.forward(data.queries[:1], data.keys[0][:1], data.values[0][:1], md, **kwargs)


def test_forward_args_output_is_written_in_place():
    """A preallocated `output` receives the result; causal=False on one new token equals the default."""
    spec = SPECS["small_decode"]
    out = torch.empty(1, 4, 64)
    via_record = _forward(spec, forward_args=AttentionForwardArgs(causal=False, output=out))
    assert via_record is out
    assert torch.equal(_forward(spec), out)


def test_forward_refuses_missing_cache_and_wrong_metadata():
    """No cache bound, another backend's metadata, or a q of the wrong shape: clear errors."""
    layer = create_attention(0, 4, 64, 2, backend="FLEX")
    q = torch.zeros(1, 4, 64)
    md = resolve("attention_backend", "VANILLA").prepare([(1, 0, (0,))], 16)
    with pytest.raises(RuntimeError, match=r"no KV cache attached; the engine must call Attention.bind"):
        layer.forward(q, q[:, :2], q[:, :2], md)
    layer.attach_kv_cache(layer.kv_cache_spec("float32").allocate(2))
    with pytest.raises(TypeError, match=r"FLEX needs FlexMetadata \(build it with FlexBackend\.prepare\)"):
        layer.forward(q, q[:, :2], q[:, :2], md)
    sdpa = create_attention(0, 4, 64, 2, backend="SDPA")
    sdpa.attach_kv_cache(sdpa.kv_cache_spec("float32").allocate(2))
    with pytest.raises(ValueError, match=r"q must be \[T=1, 4, 64\], got \(1, 4, 32\)"):
        sdpa.forward(
            torch.zeros(1, 4, 32), q[:, :2], q[:, :2], resolve("attention_backend", "SDPA").prepare([(1, 0, (0,))], 16)
        )


def test_attach_checks_cache_shape_and_dtype():
    """A cache of the wrong rank or dtype is refused at bind time."""
    layer = create_attention(0, 4, 64, 2, backend="SDPA", kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="kv_cache must be 5-D with 2 plane"):
        layer.attach_kv_cache(torch.zeros(4, 16, 2, 64))
    with pytest.raises(ValueError, match=r"kv_cache_dtype is fp8_e4m3 but the cache tensor is torch.float32"):
        layer.attach_kv_cache(KVCacheSpec(2, 64, "float32").allocate(2))


def test_typed_options(fresh_registry):
    """Backend.Options parses mappings and CLI strings; unknown keys are errors."""
    flex = resolve("attention_backend", "FLEX")
    assert flex.parse_options({"compile": "false"}).compile is False
    assert flex.parse_options(None).compile is True
    with pytest.raises(ConfigError, match="unknown option\\(s\\) for attention backend FLEX: fast"):
        create_attention(0, 4, 64, 2, backend="FLEX", options={"fast": True})
    with pytest.raises(ConfigError, match="must be a mapping or FlexOptions, got list"):
        flex.parse_options(["compile"])


def test_unknown_geometry_argument_is_a_type_error():
    """Backends are built from a geometry record only; an unknown argument is named."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'rope_theta'"):
        create_attention(0, 4, 64, 2, backend="VANILLA", rope_theta=1e4)
    with pytest.raises(TypeError, match="VanillaBackend is built from an AttentionGeometry, got int"):
        resolve("attention_backend", "VANILLA")(0)


def test_attention_layer_binds_and_runs_like_the_backend():
    """The nn.Module layer binds a backend by name and gives the same output as driving the backend."""
    spec = SPECS["mixed_prefill_decode"]
    layer = Attention(AttentionGeometry(0, spec.num_heads, spec.head_dim, spec.num_kv_heads, spec.head_dim**-0.5))
    with pytest.raises(RuntimeError, match="attention layer 0 \\(attention\\) is not bound"):
        layer(torch.zeros(1, 4, 64), torch.zeros(1, 2, 64), torch.zeros(1, 2, 64), None)
    backend = layer.bind("SDPA", KVCacheSpec(2, 64, "float32").allocate(4))
    assert layer.backend is backend and backend.name == "SDPA" and "backend=SDPA" in repr(layer)
    assert layer.attn_type is AttentionType.FULL
    want = run_backend("SDPA", spec)
    assert_close("SDPA", spec, run_backend(type(backend), spec), want)


def test_layer_registry_keys_and_weakrefs():
    """Layers register by index with _0/_1 on collision, and a dropped layer disappears."""
    with collect_attention_layers() as registry:
        a, b, c = (Attention(AttentionGeometry(i, 2, 8, 2, 1.0)) for i in (0, 1, 1))
        extra = Attention(AttentionGeometry(2, 2, 8, 2, 1.0))
    assert list(registry.layers()) == ["0", "1_0", "1_1", "2"]
    del extra
    gc.collect()
    assert list(registry.layers()) == ["0", "1_0", "1_1"]
    model = torch.nn.ModuleList([a, b, c])
    assert list(attention_layers(model)) == ["0", "1_0", "1_1"]


def test_backend_customises_its_kv_cache_spec():
    """A backend's preferred block size becomes the spec's default; an engine-chosen size still wins."""
    from kernelbay.attention import AttentionBackend, AttentionGeometry

    class BigBlocks(AttentionBackend):
        name = "BIGBLOCKS"
        preferred_block_size = 64

    geometry = AttentionGeometry(0, 8, 128, 2, scale=0.1)
    assert BigBlocks.get_kv_cache_spec(geometry, "bfloat16").block_size == 64
    spec = BigBlocks.get_kv_cache_spec(geometry, "bfloat16", "fp8", block_size=16, layout="HND")
    assert (spec.block_size, spec.dtype, spec.layout.value, spec.bytes_per_token) == (16, "fp8_e4m3", "HND", 512)


def test_a_layers_geometry_record_is_built_once_and_shared_with_its_backend():
    """The engine's Attention layer holds the AttentionGeometry it is given; binding hands that record over."""
    layer = Attention(AttentionGeometry(2, 4, 64, 2, 0.125, AttentionType.SLIDING, sliding_window=8))
    backend = layer.bind("VANILLA", KVCacheSpec(num_kv_heads=2, head_dim=64, dtype="float32").allocate(4))
    assert backend.geometry is layer.geometry
    assert create_attention(0, 4, 64, 2, backend="VANILLA").geometry.scale == 64**-0.5


def test_an_overridden_capability_check_is_asked_everywhere(fresh_registry):
    """A backend refusing more than its declarations (a library version, say) is refused by construction,
    option validation and the selector alike, through its one capability_failures."""
    from kernelbay import register_attention_backend
    from kernelbay.attention import BackendNotCapable, select_attention_backend
    from kernelbay_engine.options import AttentionOptions, validate_options

    vanilla = resolve("attention_backend", "VANILLA")

    class OldLibrary(vanilla):
        name = "OLDLIB"

        @classmethod
        def capability_failures(cls, req, fields=None):
            extra = ["head_size: this library build has no 80-wide kernel"] if req.head_size == 80 else []
            return super().capability_failures(req, fields) + extra

    register_attention_backend("OLDLIB", target=OldLibrary)
    with pytest.raises(ValueError, match="no 80-wide kernel"):
        create_attention(0, 4, 80, 2, backend=OldLibrary)
    with pytest.raises(ConfigError, match="OLDLIB: head_size: this library build has no 80-wide kernel"):
        validate_options(AttentionOptions(backend="OLDLIB", head_size=80, dtype="float32"))
    with pytest.raises(BackendNotCapable, match="no 80-wide kernel"):
        select_attention_backend(AttentionRequirements(head_size=80, dtype="float32"), requested="OLDLIB")
