"""Many threads resolving at once import each provider once and agree on the registry."""

from __future__ import annotations

import threading
from collections import Counter

from .conftest import fixture_imports


def test_threads_resolving_same_and_different_names_import_each_provider_once(make_registry):
    """16 threads x 3 names: one import per provider module, every thread sees the same classes."""
    reg = make_registry()
    names = ["GoodForCausalLM", "GoodLMHeadModel", "OtherForCausalLM"]
    results: list[tuple[str, object]] = []
    barrier = threading.Barrier(16)

    def work(i: int) -> None:
        barrier.wait()
        name = names[i % len(names)]
        results.append((name, reg.resolve("model", name)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counter(fixture_imports()) == {"kb_good.modeling": 1, "kb_other.modeling": 1}
    by_name = {}
    for name, cls in results:
        assert by_name.setdefault(name, cls) is cls
    assert by_name["GoodForCausalLM"] is by_name["GoodLMHeadModel"]
    assert len(results) == 16
