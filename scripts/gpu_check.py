"""One device call that proves the engine's GPU path (run it through ``scripts/gpu_check.sh``): writes
``results/cuda/<date>-<gpu>.md`` and ``.csv`` (after every section, so a call cut short still brings back what it
measured) and the CUDA tests' output beside them (``-pytest.log``).

No model can travel to a lent GPU machine (no network there, 64 MiB of repository), so every model is built from
random weights in the shape that matters:
1. the CUDA subset of the unit tests (``SPECVIZ_TEST_DEVICE=cuda``);
2. greedy exactness against transformers' ``generate`` in fp32: a random target of SmolLM2-135M's shape with a random
   small draft, the n-gram lookup and a feature head (chains and 8-node token trees), on the static-shape cache with
   CUDA graphs; and tiny Llama and Qwen3 targets with synthetic EAGLE-3 heads in both published layouts (``tests/eagle3_heads.py``);
3. a random target of Qwen3-8B's shape in bf16: AR tok/s against ``generate`` (interleaved rounds), against the
   bandwidth limit (weight bytes ÷ the measured device-to-device copy bandwidth), the verify cost of 1…64 fed tokens
   relative to 1, CUDA graphs on against off (the capture counted), and one speculative run's draft / verify / overhead
   split with a synthetic EAGLE-3 head of the published 8B heads' shape, as a chain and as a dynamic token tree
   (random heads are rarely accepted, so this measures costs, not speedups), where the AR step's kernels go (torch
   profiler), and AR with the decoder layers of an earlier ``lean.py`` (``--before``) against this commit's, interleaved;
4. a speedup: the same target with its layers after the 4th damped and a copy of its first 4 layers as the draft, AR
   against SD at γ 1–5 and a dynamic tree, each beside the cost model's prediction and transformers' assisted
   generation with the same draft and γ.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.analysis.cost_model import predict_run  # noqa: E402
from specviz.bench.harness import hf_generate  # noqa: E402
from specviz.core import tree as tree_module  # noqa: E402
from specviz.core.drafters import SINGLE_PATH, ModelDrafter, NGramDrafter  # noqa: E402
from specviz.core.engine import decode  # noqa: E402
from specviz.core.errors import first_line  # noqa: E402
from specviz.core.policy import FixedPolicy  # noqa: E402
from specviz.core.tree import MAX_TREE_NODES, TreeShape  # noqa: E402
from specviz.methods.eagle3 import Eagle3Drafter, load_eagle3  # noqa: E402
from specviz.methods.feature_head import FeatureDrafter, FeatureHead  # noqa: E402
from specviz.models.backends import cached_model  # noqa: E402
from specviz.models.backends.graphs import cuda_capture  # noqa: E402
from specviz.models.loaded import LoadedModel  # noqa: E402
from specviz.models.loading import load_model  # noqa: E402
from tests.eagle3_heads import reference_drafts, tiny_target_dir, write_head  # noqa: E402

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=2048)
QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=40960,
                tie_word_embeddings=False)
CUDA_TESTS = ["tests/test_engine.py", "tests/test_lean.py", "tests/test_acceptance.py", "tests/test_chain.py", "tests/test_feature_head.py",
              "tests/test_eagle3.py", "tests/test_tree.py"]
"""The engine's tests that touch the device (the γ policies' arithmetic is left to the CPU run, to keep the call short)."""
ROWS: list[dict] = []
SECTIONS = ("worker", "tests", "exactness", "ar", "before-after", "costs", "accepted")
DEVICE, GRAPHS = "cuda", True  # --smoke: the CPU, tiny shapes and no graphs, to try the script before a device call


def record(section: str, metric: str, value, unit: str = "", note: str = "") -> None:
    ROWS.append({"section": section, "metric": metric, "value": value, "unit": unit, "note": note})
    print(f"[{section}] {metric} = {value} {unit} {note}", flush=True)


def guarded(section: str):
    """Run a section; a failure is recorded (first line) and the next section still runs."""
    def wrap(fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # the report must say what broke, and go on
                traceback.print_exc()
                record(section, "error", f"{type(exc).__name__}: {first_line(exc)[:200]}")
            record(section, "section seconds", round(time.perf_counter() - start, 1), "s")
            write()  # after every section: a call cut short still brings back what it measured
        return run
    return wrap


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def random_model(config: dict, family: str, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    kind = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[family]
    c = kind(**config, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = transformers.AutoModelForCausalLM.from_config(c, dtype=dtype).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return LoadedModel(f"random {family} {config['hidden_size']}x{config['num_hidden_layers']}", model, c.vocab_size)


def prompts(n: int, vocab: int, lengths=(16, 64, 200), seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]


@torch.inference_mode()
def generate(lm: LoadedModel, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device=DEVICE)
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)
    return out[0, len(prompt):].tolist()


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


@torch.inference_mode()
def top2_margin(lm: LoadedModel, ids: list[int]) -> float:
    top = lm.model(torch.tensor([ids], device=DEVICE)).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def emitted(events) -> list[int]:
    return [t for e in events for t in e.emitted_ids]


@guarded("cuda tests")
def cuda_tests(seconds: int) -> None:
    env = {**os.environ, "SPECVIZ_TEST_DEVICE": DEVICE, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    log = write().with_name(REPORT["stem"].name + "-pytest.log")  # the whole output, a run cut short included
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "4", "--dist", "loadgroup", "-m", "not slow",
                              "-p", "no:cacheprovider", *CUDA_TESTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired as exc:
        log.write_text("".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (exc.stdout or "", exc.stderr or "")))
        raise
    log.write_text(out.stdout + out.stderr)
    tail = out.stdout.strip().splitlines()
    summary = next((line for line in reversed(tail) if re.search(r"\d+ (passed|failed)", line)), tail[-1] if tail else "no output")
    record("cuda tests", "summary", summary.strip("= "), "", " ".join(CUDA_TESTS))
    for line in tail:
        if line.startswith(("FAILED", "ERROR")):
            record("cuda tests", "failed", line[:220])


@guarded("exactness fp32")
def exactness_135m(n: int) -> None:
    target = random_model(SMOLLM2_135M, "llama", torch.float32)
    draft = random_model({**SMOLLM2_135M, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                          "num_key_value_heads": 2}, "llama", torch.float32, seed=1)
    head = FeatureHead(target.model.config, (3, 14, 29)).to(device=DEVICE, dtype=torch.float32).eval()
    cases = [("ar", 0, SINGLE_PATH), *[(d, g, SINGLE_PATH) for d in ("draft", "ngram") for g in (1, 3, 6)],
             ("feature head", 3, SINGLE_PATH)]
    cases += [(d, 8, TreeShape(2, "dynamic")) for d in ("draft", "ngram", "feature head")]
    for prompt_set, ids in enumerate(prompts(3, SMOLLM2_135M["vocab_size"])):
        ref = generate(target, ids, n)
        for name, gamma, tree in cases:
            capacity = len(ids) + n + 1 + MAX_TREE_NODES
            cached = cached_model(target, capacity=capacity, graphs=GRAPHS, taps=(3, 14, 29) if name == "feature head" else ())
            drafters = []
            if name == "draft":
                drafters = [ModelDrafter(cached_model(draft, target.vocab_size, capacity=capacity, graphs=GRAPHS))]
            elif name == "ngram":
                drafters = [NGramDrafter()]
            elif name == "feature head":
                drafters = [FeatureDrafter(head, cached, None, "head", capacity)]
            out = emitted(decode(cached, ids, drafters=drafters, policy=FixedPolicy(gamma), max_new_tokens=n, tree=tree))
            d = first_difference(out, ref)
            note = "" if d is None else f"first difference at {d}, top-2 margin {top2_margin(target, ids + ref[:d]):.5f}"
            shape = f"tree of {gamma} nodes" if tree != SINGLE_PATH else f"γ={gamma}"
            label = f"135M-shape {name} {shape} prompt {prompt_set} (len {len(ids)})"
            record("exactness fp32", label, "equal" if d is None else "DIFFERS", "", note)


@guarded("eagle-3 exactness fp32")
def exactness_eagle3(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for family, layout, options in (("llama", "eagle", {}), ("llama", "speculators", {"norm_before_residual": True}),
                                        ("qwen3", "eagle", {"own_embed": True})):
            path = tiny_target_dir(Path(tmp) / f"{family}-{layout}", family, vocab=512, hidden=128, layers=8, heads=4, kv_heads=2)
            lm = load_model(str(path), family, torch.device(DEVICE), torch.float32)
            head_path = write_head(Path(tmp) / f"head-{family}-{layout}", lm.model.config, layout=layout, draft_ids=list(range(0, 512, 3)),
                                   **options)
            head = load_eagle3(head_path, lm.model)
            matched = positions = same = 0
            for ids in prompts(3, 512, lengths=(8, 30, 90)):
                for gamma in (1, 3, 6):
                    cached = cached_model(lm, capacity=len(ids) + n + 1, graphs=GRAPHS, taps=head.taps)
                    drafter = Eagle3Drafter(head, cached, capacity=cached.storage.stack.capacity, capture=cuda_capture if GRAPHS else None)
                    events = list(decode(cached, ids, drafters=[drafter], policy=FixedPolicy(gamma), max_new_tokens=n))
                    matched += emitted(events) == generate(lm, ids, n)
                    tokens = list(ids)
                    for e in events[:6]:
                        if e.draft_ids:
                            ref = reference_drafts(head_path, lm.model, tokens, len(e.draft_ids))
                            positions, same = positions + len(ref), same + sum(a == b for a, b in zip(e.draft_ids, ref))
                        tokens += e.emitted_ids
            record("eagle-3 exactness fp32", f"tiny {family} + {layout} head: runs equal to generate", f"{matched}/9", "runs")
            record("eagle-3 exactness fp32", f"tiny {family} + {layout} head: drafts equal to the reference forward", f"{same}/{positions}",
                   "positions")


def timed(fn) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


BANDWIDTH: list[float] = []


@guarded("8B bandwidth")
def bandwidth() -> None:
    x = torch.empty(2**28 if DEVICE == "cuda" else 2**22, dtype=torch.float32, device=DEVICE)  # 1 GiB on the GPU
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    seconds = statistics.median(timed(lambda: y.copy_(x)) for _ in range(10))
    rate = 2 * x.numel() * 4 / seconds  # bytes read and written
    record("8B bandwidth", "device-to-device copy (read + write)", round(rate / 1e12, 3), "TB/s")
    BANDWIDTH.append(rate)


@guarded("8B AR")
def ar_8b(target: LoadedModel, n: int, rounds: int) -> None:
    weight_bytes = sum(p.numel() * p.element_size() for p in target.model.parameters())
    record("8B AR", "weight bytes", round(weight_bytes / 1e9, 2), "GB", "random Qwen3-8B shape, bf16")
    if BANDWIDTH:
        record("8B AR", "bandwidth limit (weight bytes ÷ copy bandwidth)", round(BANDWIDTH[0] / weight_bytes, 1), "tok/s")
    first = prompts(1, target.vocab_size, lengths=(128,))[0]
    capacity = len(first) + n + 1
    steady = cached_model(target, capacity=capacity, graphs=GRAPHS)
    configs = {  # each round's prompt starts with another token, so every run prefills the whole prompt
        "transformers generate": lambda p: generate(target, p, n),
        "engine, graphs on (captured in this run)": lambda p: list(decode(cached_model(target, capacity=capacity, graphs=GRAPHS), p,
                                                                          max_new_tokens=n)),
        "engine, graphs on (already captured)": lambda p: list(decode(steady, p, max_new_tokens=n)),
        "engine, graphs off (static shapes)": lambda p: list(decode(cached_model(target, capacity=capacity), p, max_new_tokens=n)),
        "engine, growing cache (the CPU path)": lambda p: list(decode(cached_model(target), p, max_new_tokens=n)),
    }
    for fn in configs.values():  # warm-up: kernels, cuBLAS handles, the steady graphs
        fn(first)
    times: dict[str, list[float]] = {k: [] for k in configs}
    for r in range(rounds):
        prompt = [r + 1] + first[1:]
        for label, fn in configs.items():
            times[label].append(timed(lambda fn=fn, prompt=prompt: fn(prompt)))
    base = statistics.median(times["transformers generate"])
    for label, ts in times.items():
        median = statistics.median(ts)
        of_limit = f"; {n / median * weight_bytes / BANDWIDTH[0]:.2f} of the bandwidth limit" if BANDWIDTH else ""
        record("8B AR", label, round(n / median, 1), "tok/s", f"{n} tokens after a {len(first)}-token prompt, prefill included; median "
               f"of {rounds} interleaved rounds; {base / median:.2f}× generate{of_limit}")


@guarded("8B verify cost")
def verify_cost(target: LoadedModel, context: int = 512, reps: int = 10, fed: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 16, 32, 64)) -> None:
    ids = prompts(1, target.vocab_size, lengths=(context + max(fed),))[0]
    for graphs in sorted({GRAPHS, False}, reverse=True):
        cached = cached_model(target, capacity=context + max(fed) + 1, graphs=graphs)
        cached.forward(ids[:context], keep=1)
        costs = {}
        for k in fed:
            feed = ids[:context + k]
            for _ in range(2):  # the graph of this length is captured here
                cached.forward(feed, keep=k)
            costs[k] = statistics.median(timed(lambda feed=feed, k=k, cached=cached: cached.forward(feed, keep=k)) for _ in range(reps))
        mode = f"graphs {'on' if graphs else 'off'}"
        ms = " ".join(f"{1e3 * c:.2f}" for c in costs.values())
        record("8B verify cost", f"{mode}: ms for {', '.join(map(str, fed))} fed tokens", ms, "ms",
               f"after {context} cached positions, median of {reps}")
        record("8B verify cost", f"{mode}: cost relative to 1 token", " ".join(f"{c / costs[1]:.2f}" for c in costs.values()))


@guarded("8B speculative step")
def speculative_split(target: LoadedModel, n: int) -> None:
    """The EAGLE-3 head's draft / verify / overhead split per step, its forwards eager (growing head cache) against recorded
    as graphs (fixed-capacity head cache, one graph per fed size), chains and a dynamic tree."""
    with tempfile.TemporaryDirectory() as tmp:
        head_path = write_head(Path(tmp) / "head", target.model.config, draft_ids=list(range(32000)), std=0.02, dtype=torch.bfloat16,
                               device=DEVICE)
        head = load_eagle3(head_path, target.model)
    prompt = prompts(1, target.vocab_size, lengths=(128,))[0]
    capacity = len(prompt) + n + 1 + MAX_TREE_NODES
    for gamma, tree in ((3, SINGLE_PATH), (6, SINGLE_PATH), (16, TreeShape(4, "dynamic"))):
        for head_graphs in sorted({False, GRAPHS}):
            runs = []
            for _ in range(2):  # the first run records the graphs
                cached = cached_model(target, capacity=capacity, graphs=GRAPHS, taps=head.taps)
                drafter = Eagle3Drafter(head, cached, capacity=capacity if head_graphs else None,
                                        capture=cuda_capture if head_graphs else None)
                runs.append(list(decode(cached, prompt, drafters=[drafter], policy=FixedPolicy(gamma), max_new_tokens=n, tree=tree)))
            steps = [e for e in runs[-1][1:] if e.draft_ids]
            parts = {"drafting": lambda e: e.spans["drafting"], "verifying": lambda e: e.spans["verifying"],
                     "other": lambda e: e.total_ms - e.spans["drafting"] - e.spans["verifying"], "total": lambda e: e.total_ms}
            split = {k: statistics.median(part(e) for e in steps) for k, part in parts.items()}
            shape = f"dynamic tree of {gamma} nodes" if tree != SINGLE_PATH else f"γ={gamma}"
            mode = "head as graphs" if head_graphs else "head eager"
            record("8B speculative step", f"EAGLE-3 head {shape}, {mode}: draft / verify / overhead / total per step",
                   " / ".join(f"{v:.2f}" for v in split.values()), "ms",
                   f"median over {len(steps)} steps; drafting {split['drafting'] / split['verifying']:.3f} of the verify; accepted "
                   f"{sum(e.accepted for e in steps)} of {sum(len(e.draft_ids) for e in steps)} drafts (random head)")


def accepted_pair(target: LoadedModel, keep: int = 4, damping: float = 0.02) -> tuple[LoadedModel, LoadedModel]:
    """A target whose layers after the first ``keep`` are damped (their attention and MLP outputs scaled by
    ``damping``) and a draft made of its first ``keep`` layers, norm and LM head: a pair whose drafts the target
    accepts often, so the loop's speedup can be measured without trained weights."""
    with torch.no_grad():
        for layer in target.model.model.layers[keep:]:
            layer.self_attn.o_proj.weight.mul_(damping)
            layer.mlp.down_proj.weight.mul_(damping)
    config = target.model.config.to_dict()
    layer_types = config.get("layer_types") or []
    draft_config = type(target.model.config)(**{**config, "num_hidden_layers": keep, "layer_types": layer_types[:keep] or None})
    with torch.device(DEVICE):
        draft = transformers.AutoModelForCausalLM.from_config(draft_config, dtype=target.model.dtype).eval()
    draft.load_state_dict({k: v for k, v in target.model.state_dict().items() if not k.startswith("model.layers.")
                           or int(k.split(".")[2]) < keep}, strict=True)
    draft.generation_config.eos_token_id, draft.generation_config.pad_token_id = None, 0
    return target, LoadedModel(f"first {keep} layers", draft, target.vocab_size)


@guarded("8B accepted draft")
def accepted_draft(target: LoadedModel, n: int, rounds: int) -> None:
    """AR, then SD at γ 1–5 and a dynamic 8-node tree with the draft of :func:`accepted_pair`, each against
    transformers' assisted generation with the same draft and γ; beside every realized speedup, the cost model's
    prediction from the run's own acceptance and costs (``specviz.analysis.cost_model.predict_run``). The tree runs
    twice: grown on the device, as a GPU run grows it, and reading each level's draw keys, as a CPU run does. Steps
    record nothing, as in the benchmarks."""
    target, draft = accepted_pair(target)
    prompt = prompts(1, target.vocab_size, lengths=(128,))[0]
    capacity = len(prompt) + n + 1 + MAX_TREE_NODES

    def engine(gamma: int, tree: TreeShape, on_device: bool) -> list:
        cached = cached_model(target, capacity=capacity, graphs=GRAPHS)
        if not gamma:
            return list(decode(cached, prompt, max_new_tokens=n, record=False))
        drafter = ModelDrafter(cached_model(draft, capacity=capacity, graphs=GRAPHS))
        tree_module.reads_wait = lambda device: on_device
        try:
            return list(decode(cached, prompt, drafters=[drafter], policy=FixedPolicy(gamma), max_new_tokens=n, tree=tree,
                               record=False))
        finally:
            tree_module.reads_wait = reads_wait

    reads_wait, dynamic = tree_module.reads_wait, TreeShape(2, "dynamic")
    runs = {"ar": (0, SINGLE_PATH, True), **{f"γ={g}": (g, SINGLE_PATH, True) for g in range(1, 6)},
            "dynamic tree of 8 nodes": (8, dynamic, True), "dynamic tree of 8 nodes, a read per level": (8, dynamic, False)}
    for run in runs.values():  # warm-up: every graph captured once
        engine(*run)
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    events: dict[str, list] = {}
    for _ in range(rounds):
        for label, run in runs.items():
            box: list = []
            seconds[label].append(timed(lambda run=run, box=box: box.extend(engine(*run))))
            events[label] = box
    ar_s = statistics.median(seconds["ar"])
    t1 = sum(e.spans["verifying"] for e in events["ar"]) / len(events["ar"])
    assert len(emitted(events["ar"])) == n
    record("8B accepted draft", "AR", round(n / ar_s, 1), "tok/s", f"{n} tokens after a {len(prompt)}-token prompt, median of {rounds}")
    for label, (gamma, tree, _) in list(runs.items())[1:]:
        tokens = len(emitted(events[label]))
        speedup = tokens / statistics.median(seconds[label]) / (n / ar_s)
        predicted = predict_run(events[label], t1)["predicted_speedup"]
        steps = [e for e in events[label] if e.draft_ids]
        accepted = sum(e.accepted for e in steps) / max(1, sum(len(e.draft_ids) for e in steps))
        note = (f"predicted {predicted:.2f}× (realized ÷ predicted {speedup / predicted:.2f}); {accepted:.0%} of drafts accepted; "
                f"{tokens} tokens, {'the same as' if emitted(events[label]) == emitted(events['ar']) else 'not all equal to'} AR's")
        if tree == SINGLE_PATH:
            hf = statistics.median(timed(lambda gamma=gamma: hf_generate(target.model, draft.model, prompt, gamma, n, []))
                                   for _ in range(rounds))
            note += f"; {hf / statistics.median(seconds[label]):.2f}× transformers' assisted generation (same draft and γ)"
        record("8B accepted draft", f"SD {label}: realized speedup over the engine's AR", round(speedup, 2), "×", note)
    grown, per_level = "dynamic tree of 8 nodes", "dynamic tree of 8 nodes, a read per level"
    same = "the same" if emitted(events[per_level]) == emitted(events[grown]) else "not the same"
    record("8B accepted draft", "dynamic tree grown on the device ÷ reading each level",
           round(statistics.median(seconds[per_level]) / statistics.median(seconds[grown]), 3), "×",
           f"tokens/s ratio, median of {rounds}; {same} tokens")


WORKER_WAYS = ("eager (static shapes)", "graphs recorded in the call", "graphs kept from the worker's last call")


def worker_calls(conn, n: int, tokens: list[int]) -> None:
    """A forked process, as ZeroGPU runs each ``@spaces.GPU`` call: CUDA starts here, never in the parent. It builds the
    8B-shape target on the GPU (ZeroGPU copies the weights in before a call starts: the same for every way, so not timed),
    runs a 2-token eager decode (the worker's first cuBLAS and kernel loads, which every way pays), then one call per way,
    each decoding ``n`` tokens after ``tokens`` and timed whole, recording included; sends (way, seconds, emitted ids)."""
    try:
        target = random_model(QWEN3_8B, "qwen3", torch.bfloat16)
        capacity = len(tokens) + n + 1 + MAX_TREE_NODES
        list(decode(cached_model(target, capacity=capacity), tokens, max_new_tokens=2))
        kept = cached_model(target, capacity=capacity, graphs=GRAPHS)
        list(decode(kept, [7] + tokens[1:], max_new_tokens=n))  # an earlier call of this worker, on another prompt
        makers = {WORKER_WAYS[0]: lambda: cached_model(target, capacity=capacity),
                  WORKER_WAYS[1]: lambda: cached_model(target, capacity=capacity, graphs=GRAPHS),
                  WORKER_WAYS[2]: lambda: kept}
        for way, make in makers.items():
            box: list = []
            made: list = []
            seconds = timed(lambda make=make, box=box, made=made: box.extend(decode(made.append(make()) or made[0], tokens,
                                                                                   max_new_tokens=n)))
            graphs = made[0].storage.stack.graphs
            conn.send((way, seconds, emitted(box), graphs.failure if graphs else None))
    except Exception as exc:  # the parent records it
        conn.send(("error", 0.0, [], f"{type(exc).__name__}: {first_line(exc)[:200]}"))
    conn.close()


@guarded("ZeroGPU worker")
def zerogpu_worker(lengths: tuple[int, ...]) -> None:
    """The three ways a hosted call can run its forwards, each in a forked worker per length (see :func:`worker_calls`).
    Must run before anything in this process touches CUDA: a forked child cannot use a CUDA context made before the fork."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    tokens = prompts(1, QWEN3_8B["vocab_size"], lengths=(128,))[0]
    for n in lengths:
        parent, child = context.Pipe()
        worker = context.Process(target=worker_calls, args=(child, n, tokens))
        worker.start()
        results = {}
        while worker.is_alive() or parent.poll():
            if parent.poll(1.0):
                way, seconds, ids, failure = parent.recv()
                if way == "error":
                    record("ZeroGPU worker", f"{n} tokens: error", failure)
                    break
                results[way] = (seconds, ids, failure)
                if len(results) == len(WORKER_WAYS):
                    break
        worker.join(60)
        eager = results.get(WORKER_WAYS[0])
        for way, (seconds, ids, failure) in results.items():
            note = f"{len(ids)} tokens after a {len(tokens)}-token prompt, prefill and any recording included"
            if eager and way != WORKER_WAYS[0]:
                note += f"; {eager[0] / seconds:.2f}× eager; tokens {'equal to' if ids == eager[1] else 'NOT equal to'} eager's"
            if failure:
                note += f"; recording refused, ran eager: {failure}"
            record("ZeroGPU worker", f"{n} tokens: {way}", round(len(ids) / seconds, 1), "tok/s", note)


@guarded("8B AR before/after")
def ar_before_after(target: LoadedModel, n: int, rounds: int, before: Path | None) -> None:
    """The engine's AR with graphs, the decoder layers of an earlier ``lean.py`` (``--before``: a copy of that file, say
    ``git show COMMIT:specviz/models/backends/lean.py``) against this commit's, interleaved in one run."""
    from specviz.models.backends import lean

    if before is None:
        record("8B AR before/after", "skipped", "no --before file given")
        return
    spec = importlib.util.spec_from_file_location("lean_before", before)
    earlier = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(earlier)
    first = prompts(1, target.vocab_size, lengths=(128,))[0]
    capacity = len(first) + n + 1
    current = lean.LeanStack._layers
    ways = {f"before: the layers of {before.name}": earlier.LeanStack._layers, "after: this commit's layers": current}
    times: dict[str, list[float]] = {k: [] for k in ways}
    outputs: dict[str, list[int]] = {}
    try:
        for r in range(rounds + 1):  # round 0 warms up (and records every graph)
            prompt = [r + 1] + first[1:]
            for label, layers in ways.items():
                lean.LeanStack._layers = layers
                box: list = []
                seconds = timed(lambda box=box, prompt=prompt: box.extend(decode(cached_model(target, capacity=capacity, graphs=GRAPHS),
                                                                                 prompt, max_new_tokens=n)))
                if r:
                    times[label].append(seconds)
                    outputs[label] = emitted(box)
    finally:
        lean.LeanStack._layers = current
    limit = BANDWIDTH[0] / sum(p.numel() * p.element_size() for p in target.model.parameters()) if BANDWIDTH else None
    for label, ts in times.items():
        rate = n / statistics.median(ts)
        record("8B AR before/after", label, round(rate, 1), "tok/s", f"graphs recorded in each run; median of {rounds} interleaved rounds"
               + (f"; {rate / limit:.2f} of the bandwidth limit" if limit else ""))
    a, b = outputs.values()
    d = first_difference(a, b)
    record("8B AR before/after", "first difference between the two (bf16 rounding)", "none" if d is None else d, "",
           "the same tokens" if d is None else "the index of the first token that differs")


@guarded("8B AR profile")
def ar_profile(target: LoadedModel, steps: int = 16) -> None:
    """Where one AR step's time goes: the GPU kernels of ``steps`` steps by kind (torch profiler, graphs off, so every
    kernel is seen), and with graphs the GPU's busy share of the wall time (the rest: launches and the host's loop)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    prompt = prompts(1, target.vocab_size, lengths=(128,))[0]
    kinds = {"GEMM (linear layers, LM head)": ("gemm", "gemv", "cutlass", "cublas", "sm90_xmma", "nvjet", "splitk"),
             "attention": ("flash", "fmha", "attention", "softmax"),
             "copies and indexing": ("copy", "index", "cat", "fill", "memcpy", "memset"),
             "reductions (norms)": ("reduce", "mean", "norm"),
             "elementwise (rotary, SiLU, residual, casts)": ("elementwise", "vectorized", "unrolled")}
    for graphs in sorted({False, GRAPHS}):
        cached = cached_model(target, capacity=len(prompt) + steps + 8, graphs=graphs)
        list(decode(cached, prompt, max_new_tokens=steps))  # records any graphs
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
        with profile(activities=activities) as prof:
            wall = timed(lambda cached=cached: list(decode(cached, [3] + prompt[1:], max_new_tokens=steps)))
        events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        busy = sum(e.device_time_total for e in events) / 1e3  # µs → ms
        mode = f"graphs {'on' if graphs else 'off'}"
        record("8B AR profile", f"{mode}: wall / GPU busy per step (prefill included)", f"{1e3 * wall / steps:.2f} / {busy / steps:.2f}",
               "ms",
               f"{steps} steps after a {len(prompt)}-token prompt; GPU busy {busy / (1e3 * wall):.0%} of the wall")
        if graphs or not events:
            continue
        by_kind = {k: 0.0 for k in kinds} | {"other": 0.0}
        for e in events:
            name = e.name.lower()
            by_kind[next((k for k, keys in kinds.items() if any(x in name for x in keys)), "other")] += e.device_time_total / 1e3
        record("8B AR profile", f"{mode}: GPU ms per step by kernel kind", "; ".join(f"{k} {v / steps:.2f}" for k, v in by_kind.items()),
               "ms",
               f"{len(events) / steps:.0f} kernels per step")
        top = sorted(events, key=lambda e: -e.device_time_total)
        totals: dict[str, float] = {}
        for e in top:
            totals[e.name[:60]] = totals.get(e.name[:60], 0.0) + e.device_time_total / 1e3
        record("8B AR profile", f"{mode}: the 5 costliest kernels, ms per step",
               "; ".join(f"{k} {v / steps:.2f}" for k, v in sorted(totals.items(), key=lambda kv: -kv[1])[:5]), "ms")


def device_name() -> str:
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu smoke run"


REPORT: dict = {}
"""Where the report goes (``out``: the folder, ``stem``: its files' path once chosen) and when the run started."""


def write() -> Path:
    """Write the report so far to ``<out>/<date>-<gpu>{,-N}.{md,csv}``, the stem chosen at the first write (a rerun never
    overwrites an earlier run's files; the worker section runs before the first, as its fork must come before CUDA starts)."""
    if "stem" not in REPORT:
        gpu = re.sub(r"[^A-Za-z0-9]+", "-", device_name()).strip("-").lower()
        out_dir, stem = REPORT["out"], REPORT["out"] / f"{datetime.date.today().isoformat()}-{gpu}"
        for n in range(2, 100):
            if not stem.with_suffix(".md").exists():
                break
            stem = out_dir / f"{datetime.date.today().isoformat()}-{gpu}-{n}"
        out_dir.mkdir(parents=True, exist_ok=True)
        REPORT["stem"] = stem
    stem = REPORT["stem"]
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["section", "metric", "value", "unit", "note"])
        w.writeheader()
        w.writerows(ROWS)
    lines = [f"# GPU check: {device_name()}", "",
             f"`{' '.join(['bash scripts/gpu_check.sh', *sys.argv[1:]])}` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
             "commit "
             f"{os.environ.get('SPECVIZ_COMMIT', 'unknown')}; torch {torch.__version__}, transformers {transformers.__version__}, "
             f"CUDA {torch.version.cuda}; {time.perf_counter() - REPORT['started']:.0f} s in all. Random weights throughout (see "
             "scripts/gpu_check.py): costs and exactness; the accepted draft's speedups come from a damped target.", ""]
    section = None
    for row in ROWS:
        if row["section"] != section:
            section = row["section"]
            lines += ["", f"## {section}", "", "| metric | value | unit | note |", "|---|---|---|---|"]
        lines.append(f"| {row['metric']} | {row['value']} | {row['unit']} | {row['note']} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "cuda")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--test-seconds", type=int, default=150)
    ap.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections (default: all)")
    ap.add_argument("--worker-tokens", type=int, nargs="+", default=[32, 64, 512], help="tokens per call in the worker section")
    ap.add_argument("--before", type=Path,
                    help="an earlier specviz/models/backends/lean.py: its decoder layers are the AR before/after's before")
    ap.add_argument("--smoke", action="store_true", help="try the script on the CPU with tiny shapes (no graphs, no tests)")
    a = ap.parse_args()
    global DEVICE, GRAPHS, QWEN3_8B, SMOLLM2_135M
    if a.smoke:
        DEVICE, GRAPHS = "cpu", False
        small = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
        SMOLLM2_135M = {**SMOLLM2_135M, **small, "vocab_size": 2048, "head_dim": 32}
        QWEN3_8B = {**QWEN3_8B, **small, "vocab_size": 40000, "num_hidden_layers": 8}
    REPORT.update(out=a.out, started=time.perf_counter())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    run = set(a.only or SECTIONS)
    if "worker" in run:
        zerogpu_worker(tuple(a.worker_tokens) if not a.smoke else (8,))  # first: the fork must come before this process touches CUDA
    if "tests" in run and not a.smoke:
        cuda_tests(a.test_seconds)
    total = f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB" if DEVICE == "cuda" else ""
    record("machine", "gpu", device_name(), "", total)
    if "exactness" in run:
        exactness_135m(48)
        exactness_eagle3(40)
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    bandwidth()
    target = random_model(QWEN3_8B, "qwen3", torch.bfloat16)
    if "ar" in run:
        ar_8b(target, a.tokens, a.rounds)
        ar_profile(target)
    if "before-after" in run:
        ar_before_after(target, a.tokens, a.rounds, a.before)
    if "costs" in run:
        verify_cost(target)
        speculative_split(target, 48)
    if "accepted" in run:
        accepted_draft(target, a.tokens, a.rounds)  # last: it damps the target's later layers
    stem = write()
    print(f"wrote {stem}.md and .csv", flush=True)


if __name__ == "__main__":
    main()
