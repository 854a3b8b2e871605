"""Property tests: the registry is a function of the set of providers, and rebuild equals live state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kernelbay.registry import Registry
from kernelbay.registry._discovery import Discovery
from kernelbay.registry._records import Origin, Preferences, Provider

NAMES = ["A", "B", "C"]
PROVIDERS = [Provider(f"builtin_{i}", f"kernelbay-b{i}", "1", Origin.BUILTIN) for i in range(2)] + [
    Provider(f"external_{i}", f"ext-{i}", "1", Origin.EXTERNAL) for i in range(3)
]

claims = st.lists(st.tuples(st.sampled_from(PROVIDERS), st.sampled_from(NAMES)), min_size=0, max_size=10)


def _empty_registry(prefs: Preferences | None = None) -> Registry:
    reg = Registry(environ={}, discovery=Discovery())
    if prefs:
        reg._prefs = prefs
    return reg


def _play(sequence) -> Registry:
    reg = _empty_registry()
    for provider, name in sequence:
        reg.record(provider, [("model", name, f"{provider.module}:{name}")])
    return reg


def _slots(reg):
    return {(s.kind, s.name): (s.winner, frozenset(s.displaced), frozenset(s.conflict)) for s in reg.slots()}


@settings(max_examples=150, deadline=None)
@given(claims, st.randoms())
def test_final_registry_does_not_depend_on_import_order(sequence, rnd):
    """Any permutation of the same registrations yields the identical registry."""
    shuffled = list(sequence)
    rnd.shuffle(shuffled)
    assert _slots(_play(sequence)) == _slots(_play(shuffled))


@settings(max_examples=150, deadline=None)
@given(claims)
def test_external_always_wins_and_builtin_fills_only_empty_slots(sequence):
    """A slot with one external claimant is that external's; with none it is the lone built-in's."""
    reg = _play(sequence)
    for name in NAMES:
        providers = {p for p, n in sequence if n == name}
        externals = {p for p in providers if p.origin is Origin.EXTERNAL}
        slot = reg.slot("model", name)
        if len(externals) == 1:
            assert slot.winner.provider in externals
        elif len(externals) > 1:
            assert slot.winner is None and {r.provider for r in slot.conflict} == externals
        elif len(providers) == 1:
            assert slot.winner.provider in providers


ops = st.lists(
    st.one_of(
        st.tuples(st.just("register"), st.sampled_from(PROVIDERS), st.sampled_from(NAMES)),
        st.tuples(st.just("unregister"), st.sampled_from(PROVIDERS), st.none()),
        st.tuples(st.just("rebuild"), st.none(), st.none()),
    ),
    max_size=20,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_rebuild_equals_live_state_after_any_sequence(sequence):
    """After any register/unregister/rebuild sequence, replaying the log gives the live state."""
    reg = _empty_registry()
    for op, provider, name in sequence:
        if op == "register":
            reg.record(provider, [("model", name, f"{provider.module}:{name}")])
        elif op == "unregister":
            reg.unregister_provider(provider.module)
        else:
            reg.rebuild()
    live = _slots(reg)
    replayed = _empty_registry()
    for r in reg.log():
        replayed.record(r.provider, [(r.kind, r.name, r.target)])
    reg.rebuild()
    assert _slots(reg) == live == _slots(replayed)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(0, 2))
def test_slots_by_key_stay_in_step_with_the_log(sequence, variants):
    """Slots are read from the log grouped by key; after any sequence (a provider claiming a name again with
    another target included) they equal what the log itself gives, slot for slot, and one key alone reads the
    same slot."""
    reg = _empty_registry()
    for step, (op, provider, name) in enumerate(sequence):
        if op == "register":
            target = f"{provider.module}:{name}{step % (variants + 1)}"
            reg.record(provider, [("model", name, target)])
        elif op == "unregister":
            reg.unregister_provider(provider.module)
        else:
            reg.rebuild()
    from_log = reg._slots(claims=reg.log())
    assert reg._slots() == from_log
    for key, slot in from_log.items():
        assert reg._slots(key) == {key: slot}
    assert all(reg._slots(("model", name)) == {} for name in NAMES if ("model", name) not in from_log)


@settings(max_examples=100, deadline=None)
@given(claims, st.lists(st.sampled_from(PROVIDERS), max_size=3))
def test_the_claims_index_is_the_log_regrouped(sequence, unregistered):
    """The per-slot claims the registry reads slots from hold exactly the log's registrations (each provider's in
    its order) after any registrations and unregistrations: the log is the one state, the index only regroups it."""
    reg = _play(sequence)
    for provider in unregistered:
        reg.unregister_provider(provider.module)

    def by_key_and_provider(regs):
        grouped: dict = {}
        for r in regs:
            grouped.setdefault(r.key, {}).setdefault(r.provider, []).append(r)
        return grouped

    assert by_key_and_provider(r for regs in reg._claims.values() for r in regs) == by_key_and_provider(reg.log())
    assert not [key for key, regs in reg._claims.items() if not regs]
