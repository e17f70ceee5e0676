"""Regen client memory: peak RSS of the regen client at 1M prompts / at 10K prompts (goal <= 1.2).

The server is the reference server in synthetic mode (no model: a fixed number of cycling ids after a small fixed
delay), so the client is the bottleneck. Each size runs ``python -m eagle3.regen`` in a fresh process (the stage
runner the flow's tasks call) and reads its peak RSS from ``getrusage``. ``--quick``: 2K vs 50K prompts.

    python benchmarks/regen_scale.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eagle3.config import PipelineConfig, RegenConfig, TargetConfig
from eagle3.serve.launch import reference_server

sys.path.insert(0, str(Path(__file__).parent))
from regen_overhead import write_prompts


def build_tokenizer_dir(out: Path) -> Path:
    from eagle3.dev.tiny_target import build_tokenizer

    build_tokenizer([f"question {i} about topic {i % 11}" for i in range(500)], vocab_size=512).save_pretrained(out)
    return out


def peak_rss_mb(config_path: Path, prompts: Path) -> tuple[float, float]:
    """Peak RSS (MB) and wall time of one regen client process."""
    code = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    cmd = [sys.executable, "-m", "eagle3.regen", "--config", str(config_path), "--prompts", str(prompts)]
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, check=True)
    rc, kb = out.stdout.split()
    if rc != "0":
        raise RuntimeError(f"regen client exited with {rc}")
    return int(kb) / 1024, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2K vs 50K prompts")
    parser.add_argument("--delay", type=float, default=0.002)
    parser.add_argument("--sizes", type=int, nargs=2, default=None, help="Override: small and large prompt counts.")
    args = parser.parse_args()
    small, large = args.sizes or ((2_000, 50_000) if args.quick else (10_000, 1_000_000))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok = build_tokenizer_dir(root / "tok")
        extra = ["--synthetic-tokens", "8", "--synthetic-delay", str(args.delay)]
        results = {}
        with reference_server(None, extra_args=extra) as server:
            for n in (small, large):
                prompts = write_prompts(root / f"p{n}", n, rows_per_shard=2000)
                config = PipelineConfig(
                    name="scale",
                    root=str(root / f"run{n}"),
                    target=TargetConfig(model_path=str(tok), num_layers=8, hidden_size=8, vocab_size=512),
                    regen=RegenConfig(servers=[server.url], concurrency_per_server=64, max_new_tokens=8),
                )
                path = root / f"config{n}.yaml"
                path.write_text(config.to_yaml())
                rss, wall = peak_rss_mb(path, prompts)
                results[n] = {"peak_rss_mb": round(rss, 1), "wall_s": round(wall, 1), "req_s": round(n / wall, 1)}
    ratio = results[large]["peak_rss_mb"] / results[small]["peak_rss_mb"]
    print(json.dumps({"small": small, "large": large, **{str(k): v for k, v in results.items()}}, indent=2))
    print(f"regen memory ratio (RSS at {large:,} / at {small:,} prompts) = {ratio:.3f}  (goal <= 1.2)")


if __name__ == "__main__":
    main()
