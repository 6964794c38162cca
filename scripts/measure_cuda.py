"""The engine on a GPU, for a session lent one (README "On a GPU", ``results/cuda/README.md``): greedy exactness against
transformers' ``generate``, and the engine's speed against transformers' assisted generation.

The real target cannot travel to the GPU machine (only 64 MiB go, the repository included), so the target is a
random-initialised Llama of SmolLM2-135M's exact shape. Its drafts: the bundled draft-s, draft-m and feature
head (real weights; same vocabulary and hidden size, but trained for another target, so they are rarely
accepted), the n-gram lookup, and ``early-4``, the target's own first 4 layers under its final norm and tied
head. Plain random layers would make every layer a fresh scramble and early-4 would never agree with the
target, so the target's layers 5-30 have their output projections scaled by ``LATE_SCALE``: they still cost
what they cost, and early-4 is accepted most of the time (0.89 on the H100 run). A random
target's greedy answer soon repeats itself, so the n-gram lookup is accepted almost always here. Prompts are
random token ids (no tokenizer travels either).

    python scripts/measure_cuda.py --out out/cuda/run   # writes out/cuda/run.md and run.csv (--out is required)

The unit tests of the engine run on the GPU with ``SPECVIZ_TEST_DEVICE=cuda pytest tests/test_engine.py
tests/test_lean.py tests/test_acceptance.py tests/test_chain.py tests/test_feature_head.py tests/test_policies.py``.
"""

from __future__ import annotations

import argparse
import copy
import csv
import statistics
import sys
from pathlib import Path

import torch
import transformers

from specviz.bench.harness import hf_generate, rotations
from specviz.bench.report import markdown
from specviz.core.cache import CachedModel
from specviz.core.drafters import Drafter, ModelDrafter, NGramDrafter
from specviz.core.engine import decode
from specviz.core.metrics import summarize
from specviz.core.policy import FixedPolicy
from specviz.core.record import StepEvent
from specviz.core.timing import Stopwatch
from specviz.methods.feature_head import FeatureDrafter, FeatureHead, load_head
from specviz.models.backends import cached_model
from specviz.models.loaded import LoadedModel
from specviz.models.loading import load_model, pick_device

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
                    max_position_embeddings=2048, eos_token_id=None, bos_token_id=None, pad_token_id=None)
MODELS = Path("assets/models")
EARLY_LAYERS, LATE_SCALE = 4, 0.05
DRAFTERS = ("early-4", "draft-s", "draft-m", "head", "ngram")


class Pair:
    """The random target in one dtype with every draft of :data:`DRAFTERS` loaded on its device."""

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int = 0):
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOLLM2_135M)).eval()
        model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
        with torch.no_grad():
            for layer in model.model.layers[EARLY_LAYERS:]:
                layer.self_attn.o_proj.weight.mul_(LATE_SCALE)
                layer.mlp.down_proj.weight.mul_(LATE_SCALE)
        self.target = LoadedModel("random SmolLM2-135M", model.to(device=device, dtype=dtype), SMOLLM2_135M["vocab_size"])
        self.drafts = {"early-4": early_layers(self.target, EARLY_LAYERS),
                       **{name: load_model(str(MODELS / f"smollm2-{name}"), name, device, dtype) for name in ("draft-s", "draft-m")}}
        self.head: tuple[FeatureHead, list[int] | None] = load_head(MODELS / "smollm2-head", self.target.model)

    def engine(self, prompt: list[int], n: int, drafter: str | None = None, gamma: int = 0, lean: bool = True,
               full_vocab: bool = False) -> list[StepEvent]:
        """One greedy decode through the engine; ``lean`` picks the production cache path, else transformers'."""
        vocab = self.target.vocab_size
        target = cached_model(self.target, vocab) if lean else CachedModel(self.target, vocab)
        drafters: list[Drafter] = []
        if drafter == "head":
            drafters = [FeatureDrafter(self.head[0], target, None if full_vocab else self.head[1], "head")]
        elif drafter == "ngram":
            drafters = [NGramDrafter()]
        elif drafter:
            draft = self.drafts[drafter]
            drafters = [ModelDrafter(cached_model(draft, vocab, full_vocab) if lean else CachedModel(draft, vocab))]
        return list(decode(target, prompt, drafters=drafters, policy=FixedPolicy(gamma), max_new_tokens=n))

    @torch.inference_mode()
    def top2_margin(self, ids: list[int]) -> float:
        """How far the target's most likely next token leads the second, in its own dtype's logits."""
        top = self.target.model(torch.tensor([ids], device=self.target.device)).logits[0, -1].float().topk(2).values
        return float(top[0] - top[1])

    @torch.inference_mode()
    def generate(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        """transformers' greedy ``generate`` on the target: the reference ids and the wall seconds."""
        ids = torch.tensor([prompt], device=self.target.device)
        watch = Stopwatch(ids.device)
        start = watch.mark()
        out = self.target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)
        return out[0, len(prompt):].tolist(), watch.seconds(start, watch.mark())


def early_layers(target: LoadedModel, layers: int) -> LoadedModel:
    """The target cut after ``layers`` decoder layers (a copy, so that it keeps its own cache)."""
    model = copy.deepcopy(target.model)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    return LoadedModel(f"early-{layers}", model, target.vocab_size)


def random_prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = [8, 40, 120, 300]
    return [torch.randint(1, SMOLLM2_135M["vocab_size"], (lengths[i % 4],), generator=gen).tolist() for i in range(n)]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def exactness(pair: Pair, prompts: list[list[int]], n: int, dtype_name: str, drafters: list[str], gammas: list[int]) -> list[dict]:
    """AR and every drafter at every γ, on both cache paths, against ``generate``: prompts matched, and where one
    differs, the position and the reference's top-2 logit margin there (0.0: a tie at the dtype's precision)."""
    refs = [pair.generate(p, n)[0] for p in prompts]
    rows = []
    for lean in (True, False):
        for drafter, gamma in [(None, 0)] + [(d, g) for d in drafters for g in gammas]:
            diffs = []
            for prompt, ref in zip(prompts, refs):
                ids = [t for e in pair.engine(prompt, n, drafter, gamma, lean) for t in e.emitted_ids]
                if (d := first_difference(ids, ref)) is not None:
                    diffs.append(f"{d} (margin {pair.top2_margin(prompt + ref[:d]):.4f})")
            rows.append({"dtype": dtype_name, "cache": "lean" if lean else "transformers", "drafter": drafter or "ar (no draft)",
                         "gamma": gamma, "matched": len(prompts) - len(diffs), "prompts": len(prompts),
                         "first_differences": "; ".join(diffs)})
            print(rows[-1], flush=True)
    return rows


def timed_configs(pair: Pair, gamma: int) -> dict:
    """label -> (run(prompt, n) -> (new ids, wall s, events or None), peer label or None)."""
    def engine(drafter=None, full_vocab=False):
        def run(prompt, n):
            events = pair.engine(prompt, n, drafter, gamma if drafter else 0, full_vocab=full_vocab)
            return [t for e in events for t in e.emitted_ids], summarize(events)["wall_s"], events
        return run

    def assisted(name):
        return lambda prompt, n: (*hf_generate(pair.target.model, pair.drafts[name].model, prompt, gamma, n, []), None)

    return {
        "hf generate (AR)": (lambda prompt, n: (*pair.generate(prompt, n), None), None),
        "engine ar": (engine(), "hf generate (AR)"),
        f"engine sd early-4 γ={gamma}": (engine("early-4"), f"hf-assisted early-4 γ={gamma}"),
        f"hf-assisted early-4 γ={gamma}": (assisted("early-4"), None),
        f"engine sd draft-m γ={gamma}": (engine("draft-m"), f"hf-assisted draft-m γ={gamma}"),
        f"engine sd draft-m γ={gamma}, full draft vocab": (engine("draft-m", True), f"hf-assisted draft-m γ={gamma}"),
        f"hf-assisted draft-m γ={gamma}": (assisted("draft-m"), None),
        f"engine sd head γ={gamma}": (engine("head"), None),
        f"engine sd ngram γ={gamma}": (engine("ngram"), None),
    }


def speed(pair: Pair, prompts: list[list[int]], n: int, gamma: int, repeats: int, dtype_name: str) -> list[dict]:
    """Each configuration on each prompt, interleaved in rotated order, fastest of ``repeats`` rounds."""
    configs = timed_configs(pair, gamma)
    for run, _ in configs.values():  # warm-up: kernels, allocator, lazily built layers
        run(prompts[0], 8)
    rows = []
    for i, prompt in enumerate(prompts):
        best: dict[str, tuple] = {}
        for order in rotations(list(configs), i, repeats):
            for label in order:
                ids, wall, events = configs[label][0](prompt, n)
                if label not in best or wall < best[label][1]:
                    best[label] = (ids, wall, events)
        ref_ids, ref_wall, _ = best["hf generate (AR)"]
        for label, (ids, wall, events) in best.items():
            stats = summarize(events) if events else {}
            rows.append({"dtype": dtype_name, "prompt": i, "prompt_len": len(prompt), "config": label, "peer": configs[label][1] or "",
                         "new_tokens": len(ids), "wall_s": round(wall, 5), "tokens_per_s": round(len(ids) / wall, 2),
                         "speedup_vs_hf_ar": round(ref_wall / wall * len(ids) / len(ref_ids), 4), "same_tokens_as_hf_ar": ids == ref_ids,
                         "accept_rate": round(stats.get("accept_rate", float("nan")), 4),
                         "mean_accept_len": round(stats.get("mean_accept_len", float("nan")), 3),
                         "engine_overhead_frac": round(stats.get("engine_overhead_frac", float("nan")), 4)})
        print(f"[{dtype_name} {i + 1}/{len(prompts)}] " + ", ".join(f"{k} {len(v[0]) / v[1]:.0f}" for k, v in best.items()), flush=True)
    return rows


def ratio_rows(rows: list[dict]) -> list[dict]:
    """Per-prompt tok/s ratio of each engine row to its transformers peer."""
    tps = {(r["dtype"], r["prompt"], r["config"]): r["tokens_per_s"] for r in rows}
    out = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for label, peer in dict.fromkeys((r["config"], r["peer"]) for r in rows if r["dtype"] == dtype and r["peer"]):
            ratios = [tps[(dtype, p, label)] / tps[(dtype, p, peer)] for d, p, c in tps if d == dtype and c == label]
            out.append({"dtype": dtype, "engine row": label, "peer": peer, "median": statistics.median(ratios),
                        "min": min(ratios), "max": max(ratios), "prompts": len(ratios)})
    return out


def summary_rows(rows: list[dict]) -> list[dict]:
    out = []
    for dtype, label in dict.fromkeys((r["dtype"], r["config"]) for r in rows):
        rs = [r for r in rows if r["dtype"] == dtype and r["config"] == label]
        out.append({"dtype": dtype, "config": label, "tok/s (median)": statistics.median(r["tokens_per_s"] for r in rs),
                    "vs hf generate (median)": statistics.median(r["speedup_vs_hf_ar"] for r in rs),
                    "accept rate": statistics.mean(r["accept_rate"] for r in rs),
                    "mean accepted len": statistics.mean(r["mean_accept_len"] for r in rs),
                    "engine overhead %": 100 * statistics.mean(r["engine_overhead_frac"] for r in rs),
                    "same tokens as hf generate": f"{sum(r['same_tokens_as_hf_ar'] for r in rs)}/{len(rs)}"})
    return out


def report(args: argparse.Namespace, device: torch.device, exact: list[dict], timed: list[dict]) -> str:
    machine = (f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}; torch {torch.__version__}, "
               f"transformers {transformers.__version__}")
    parts = [f"# The engine on {device.type.upper()}\n\n{machine}. Made by `python scripts/measure_cuda.py {' '.join(sys.argv[1:])}`.\n\n"
             "Target: a random-initialised Llama of SmolLM2-135M's shape (30 layers, hidden 576, vocabulary 49152). Drafts: "
             "the bundled draft-s, draft-m and feature head (trained for the real target), the n-gram lookup, and early-4 (the "
             f"target's first 4 layers under its own norm and head; layers 5-30 have output projections scaled by {LATE_SCALE}). "
             "Prompts: random token ids. A random target's greedy answer soon repeats itself, so n-gram drafts are accepted "
             "almost always; acceptance here says nothing about real text.\n"]
    if exact:
        parts.append(f"## Greedy exactness against `generate(do_sample=False)`\n\n{args.exact_prompts} prompts (8 to 300 tokens), "
                     f"{args.exact_tokens} new tokens. `matched` counts prompts whose continuation is token-for-token `generate`'s; "
                     "`first_differences` gives, for the others, the first differing position and the reference's top-2 "
                     f"logit margin there.\n\n{markdown(exact)}\n")
    if timed:
        parts.append(f"## Speed\n\n{args.prompts} prompts, {args.max_new_tokens} new tokens, greedy, γ = {args.gamma}; configurations "
                     f"interleaved per prompt in rotated order after a warm-up, each the fastest of {args.repeats} rounds.\n\n"
                     f"{markdown(summary_rows(timed))}\n\n### Engine against transformers\n\nPer-prompt tok/s ratio of each "
                     "engine row to its transformers peer (`generate`, or `generate(assistant_model=...)` on the same target, "
                     f"draft and γ).\n\n{markdown(ratio_rows(timed))}\n")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.csv, e.g. --out out/cuda/run")
    parser.add_argument("--prompts", type=int, default=4, help="0 skips the speed tables")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--exact-prompts", type=int, default=2, help="0 skips the exactness table")
    parser.add_argument("--exact-tokens", type=int, default=32)
    parser.add_argument("--drafters", default=",".join(DRAFTERS), help="for the exactness table")
    parser.add_argument("--gammas", default="1,3,6", help="for the exactness table")
    parser.add_argument("--gamma", type=int, default=4, help="for the speed tables")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtypes", default="bfloat16", help="comma-separated, e.g. bfloat16,float32")
    args = parser.parse_args()
    device = pick_device()
    exact, timed = [], []
    for name in args.dtypes.split(","):
        pair = Pair(device, getattr(torch, name))
        if args.prompts:
            timed += speed(pair, random_prompts(args.prompts, seed=2), args.max_new_tokens, args.gamma, args.repeats, name)
        if args.exact_prompts:
            exact += exactness(pair, random_prompts(args.exact_prompts, seed=1), args.exact_tokens, name,
                               args.drafters.split(","), [int(g) for g in args.gammas.split(",")])
        del pair
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if timed:
        with open(args.out.with_suffix(".csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(timed[0]))
            writer.writeheader()
            writer.writerows(timed)
    args.out.with_suffix(".md").write_text(report(args, device, exact, timed))
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
