"""The gate's cost on two code trees side by side: the same draft, recipe and machine, ``run_gate``
end to end (static preflight, launches, runtime preflight, measuring, report) in each tree in turn,
``--repeat`` times.

Meant for a gate change: ``--tree-a`` the code before it (e.g. ``git archive main | tar -x -C
/tmp/main``) with its own overrides, ``--tree-b`` this checkout with the overrides that configure
the same gate in its keys. Each run is a fresh process with ``PYTHONPATH`` set to its tree
(``force``, no promotion, a fresh run root). Prints per run the wall time, the verdict and what was
measured (rounds x levels x arms = timed batches, read from ``report.json``'s arms, which both
report formats carry), then the medians and the ratio b / a.

    python benchmarks/gate_cost.py --draft <export> --tree-a /tmp/main --set-a gate.concurrency=[1]
    \
        --tree-b . --set-b 'gate.traffic={1: 1, 4: 1}' [--recipe tiny] [--set
        gate.prompts_per_set=4] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = """
import json, sys, time
from eagle3.gate import release
from eagle3.recipes import resolve
job = json.loads(sys.argv[1])
config = resolve(job["recipe"], job["overrides"])
if hasattr(release, "GateRequest"):
    args, options = (release.GateRequest(drafts=[job["draft"]], promote=False, force=True),), {}
else:  # a tree from before the gate took one request
    args, options = ([job["draft"]],), {"promote": False, "force": True}
start = time.perf_counter()
result = release.run_gate(config, *args, **options)
wall = time.perf_counter() - start
arms = [a for a in result.report.arms if a.rounds]
print(json.dumps({"wall_s": wall, "verdict": str(result.report.verdict),
                  "rounds": len({r.round for a in arms for r in a.rounds}),
                  "levels": len({r.concurrency for a in arms for r in a.rounds}), "arms": len(arms),
                  "batches": sum(len(a.rounds) for a in arms)}))
"""


def _run(tree: Path, recipe: str, overrides: list[str], draft: Path, root: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    job = json.dumps(
        {"recipe": recipe, "overrides": [f"root={root}", *overrides], "draft": str(draft)}
    )
    done = subprocess.run(
        [sys.executable, "-c", RUN, job],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: run_gate failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--draft", type=Path, required=True, help="A draft export dir for the recipe's target."
    )
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument(
        "--tree-a", type=Path, required=True, help="The code tree measured first in each pair."
    )
    parser.add_argument("--tree-b", type=Path, required=True)
    parser.add_argument(
        "--set", dest="common", action="append", default=[], help="Override for both trees."
    )
    parser.add_argument("--set-a", action="append", default=[], help="Override for tree a only.")
    parser.add_argument("--set-b", action="append", default=[], help="Override for tree b only.")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for name, tree, own in (("a", args.tree_a, args.set_a), ("b", args.tree_b, args.set_b)):
                got = _run(
                    tree, args.recipe, [*args.common, *own], args.draft, Path(tmp) / f"{name}{i}"
                )
                walls[name].append(got["wall_s"])
                print(
                    f"{name} ({tree}) run {i}: {got['wall_s']:.1f} s, {got['verdict'].upper()}, {got['rounds']} "
                    f"rounds x {got['levels']} levels x {got['arms']} arms = {got['batches']} timed batches",
                    flush=True,
                )
    a, b = statistics.median(walls["a"]), statistics.median(walls["b"])
    print(f"median wall: a {a:.1f} s, b {b:.1f} s, b / a {b / a:.2f}")


if __name__ == "__main__":
    main()
