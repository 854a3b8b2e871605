import builtins

builtins.__dict__.setdefault("_kb_fixture_imports", []).append(__name__)


class GoodCpuPlatform:
    name = "cpu"
