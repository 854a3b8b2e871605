"""Start-up cost of the plugin host with 20 plugin distributions x 50 architectures installed.

    .venv/bin/python benchmarks/startup.py [--plugins 20] [--archs 50] [--one-module 2000] [--repeat 21]

Generates real installed distributions (dist-info with METADATA and entry_points.txt) into a
temporary site directory, then times, interleaved in one run against a bare `python -c pass`:
`import kernelbay`, `kernelbay plugins --json` listing every architecture, and resolving one
architecture (checking that exactly one provider module is imported). A second site holds one
distribution whose one module registers `--one-module` architectures: resolving one of them
imports it, so that case times the registry taking that many registrations at once. Reports
medians, with bytecode caching on (as after any normal install) and one warm-up run per case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_distribution(site: Path, index: int, archs: int) -> None:
    pkg = f"kbbench_{index:02d}"
    names = [f"Bench{index:02d}Arch{j:02d}ForCausalLM" for j in range(archs)]
    (site / pkg).mkdir()
    (site / pkg / "__init__.py").write_text("")
    body = ["from kernelbay import register_model", ""]
    for name in names:
        body += [f"@register_model({name!r})", f"class {name}:", "    pass", ""]
    (site / pkg / "modeling.py").write_text("\n".join(body))
    info = site / f"{pkg}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {pkg.replace('_', '-')}\nVersion: 1.0\nRequires-Dist: kernelbay>=0.1,<0.2\n"
    )
    (info / "entry_points.txt").write_text("[kernelbay.models]\n" + "".join(f"{n} = {pkg}.modeling\n" for n in names))
    (info / "RECORD").write_text("")


def time_command(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


RESOLVE = """
import sys
from kernelbay import resolve
resolve("model", "Bench07Arch13ForCausalLM")
print(",".join(sorted(m for m in sys.modules if m.startswith("kbbench_") and m.count(".") == 1)))
"""
RESOLVE_ONE_MODULE = 'from kernelbay import resolve; resolve("model", "Bench99Arch13ForCausalLM")'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugins", type=int, default=20)
    parser.add_argument("--archs", type=int, default=50)
    parser.add_argument("--one-module", type=int, default=2000, help="architectures one provider module registers")
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as tmp_one:
        site = Path(tmp)
        for i in range(args.plugins):
            write_distribution(site, i, args.archs)
        write_distribution(Path(tmp_one), 99, args.one_module)
        # Bytecode caches on, as in any normal install (this machine's shell sets PYTHONDONTWRITEBYTECODE,
        # which would make every run recompile kernelbay's sources); the warm-up below writes them.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(site)}
        py = sys.executable
        doc = json.loads(
            subprocess.run(
                [py, "-m", "kernelbay.cli", "plugins", "--json"], env=env, check=True, capture_output=True, text=True
            ).stdout
        )
        listed = sum(1 for s in doc["slots"] if s["name"].startswith("Bench"))
        imported = subprocess.run(
            [py, "-c", RESOLVE], env=env, check=True, capture_output=True, text=True
        ).stdout.strip()
        one_site = env | {"PYTHONPATH": tmp_one}
        cases = {  # name -> (command, environment)
            "bare `python -c pass`": ([py, "-c", "pass"], env),
            "`import kernelbay`": ([py, "-c", "import kernelbay"], env),
            f"`kernelbay plugins --json` ({listed} archs)": ([py, "-m", "kernelbay.cli", "plugins", "--json"], env),
            f"resolving one of {args.one_module} archs one module registers": (
                [py, "-c", RESOLVE_ONE_MODULE],
                one_site,
            ),
        }
        for cmd, cmd_env in cases.values():
            time_command(cmd, cmd_env)  # warm-up: page cache and __pycache__
        samples = {k: [] for k in cases}
        for _ in range(args.repeat):  # interleaved so machine noise hits every case alike
            for name, (cmd, cmd_env) in cases.items():
                samples[name].append(time_command(cmd, cmd_env))
        bare = statistics.median(samples["bare `python -c pass`"])
        print(f"{args.plugins} distributions x {args.archs} architectures; median of {args.repeat} runs")
        for name, xs in samples.items():
            med = statistics.median(xs)
            print(f"  {name:<52} {med:7.1f} ms   (+{med - bare:6.1f} ms over bare)")
        print(f"  resolving Bench07Arch13ForCausalLM imported provider modules: {imported}")


if __name__ == "__main__":
    main()
