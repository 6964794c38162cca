"""Replay length policies on recorded draft match lengths, with a fitted cost model in place of the machine's timings.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/simulate_policies.py record --out out/matches.json   # ~5 min
    PYTHONPATH=. .venv/bin/python scripts/simulate_policies.py replay --matches out/matches.json \
        --costs results/policies_eagle3.csv --out out/policy_sim.md                                          # seconds

``record``: for every prompt of the suites, the target's greedy answer (64 tokens) and, at each answer position t,
how many of the feature head's next 10 greedy drafts (drafted as the engine does, from the target's states of
the answer so far) match the answer, ``L[t]``, the head's top probability at each of them, and the acceptance the
predictor (``assets/models/acceptance_predictor.json``) expects from the prompt. Greedy decoding is
lossless, so every policy walks the same answer, and a step at position t with γ drafted tokens accepts min(γ, L[t]).
Written to ``--out`` as a JSON list, one object per prompt (the draft is the bundled ``head``).

``replay``: runs the real policy classes of :mod:`specviz.methods.policies` over the match lengths of ``--matches``
(default ``results/policy_sim_matches.json``), feeding them steps timed by a cost model fitted to ``--costs`` (a
``--configs policies`` benchmark CSV, default ``results/policies.csv``: per-step verify and draft milliseconds of the
fixed-γ rows, plain steps from the AR row), and writes to ``--out`` a report of each policy's tokens per second
relative to the best fixed γ, per prompt (median) and summed. The adaptive policies get the cost model's verify times as
the target's verify profile, as a run measures it at load on a CPU (one row goes without it, as on a GPU). The replay
isolates the policy's decisions from the machine's timing noise; the benchmark remains the measurement.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch
from bench_steps import ROOT, committed

from specviz.core.drafters import SINGLE_PATH
from specviz.core.policy import MAX_GAMMA, Choice, LengthPolicy, Outcome
from specviz.core.registry import GAMMA_POLICIES
from specviz.methods.policies import ConfidencePolicy, OnlinePolicy, make_policy
from specviz.runtime.config import DecodeConfig

MATCHES, COSTS = Path("results/policy_sim_matches.json"), Path("results/policies.csv")
"""The committed inputs ``replay`` reads by default."""
DEPTH, NEW_TOKENS = 10, 64


@torch.inference_mode()
def record(out: Path) -> None:
    if committed(ROOT / out):
        raise SystemExit(f"refusing to overwrite {out}: it is committed, and a matches file does not record which head made "
                         "it; pass another --out")
    from specviz.analysis.suites import load_suite
    from specviz.core.sampling import Sampler
    from specviz.methods.predictor import AcceptancePredictor
    from specviz.runtime.bank import ModelBank
    from specviz.runtime.config import DecodeConfig
    from specviz.runtime.prepare import prepare

    bank, rows, predictor = ModelBank(), [], AcceptancePredictor.load()
    for item in load_suite("all"):
        config = DecodeConfig(method="sd", draft="head", gamma=3, gamma_policy="fixed", max_new_tokens=NEW_TOKENS)
        run = prepare(config, item["prompt"], bank)
        answer = [t for e in run.events() for t in e.emitted_ids][:NEW_TOKENS]
        tokens = run.prompt_ids + answer
        drafter = run.drafters[0]
        tail = run.target.forward(tokens, keep=1)  # the target's states at every answer position
        drafter.read_states(tail.start, tail.layers)
        greedy =  Sampler(0.0, 1.0, 0, run.target.lm.device)
        lengths, confidences = [], []
        for t in range(len(answer)):
            draft = drafter.draft(tokens[:len(run.prompt_ids) + t], DEPTH, DEPTH, SINGLE_PATH, greedy)
            lengths.append(next((i for i, (d, a) in enumerate(zip(draft.ids, answer[t:])) if d != a), min(len(draft.ids), len(answer) - t)))
            confidences.append([round(float(q), 4) for q in draft.q.max(-1).values])
        rows.append({"id": item["id"], "category": item["category"], "answer": answer, "L": lengths, "top_q": confidences,
                     "predicted_acceptance": predictor.predict(drafter, run.prompt_ids)})
        print(item["id"], sum(lengths) / max(1, len(lengths)), file=sys.stderr, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows))


def cost_model(csv: Path = COSTS) -> dict:
    """Per-step milliseconds from the fixed-γ rows: verify at each γ measured (with a least-squares line for longer
    verifies; a CPU's verify cost can jump where the matrix kernel changes), draft(γ) as a line, and a plain step."""
    d = pd.read_csv(csv)
    d["steps"] = d.new_tokens / d.mean_accept_len
    g = d.groupby("config")[["steps", "draft_ms", "verify_ms"]].sum()
    fixed = g[g.index.str.startswith("fixed")]
    gammas = torch.tensor([float(c.split("=")[1]) for c in fixed.index])

    def line(y):
        A = torch.stack([torch.ones_like(gammas), gammas], 1)
        return torch.linalg.lstsq(A, torch.tensor(y.values, dtype=torch.float32)[:, None]).solution[:, 0].tolist()

    verify = fixed.verify_ms / fixed.steps
    return {"verify": dict(zip((int(x) for x in gammas.tolist()), verify.tolist())), "verify_line": line(verify),
            "draft": line(fixed.draft_ms / fixed.steps), "plain": float(g.loc["ar", "verify_ms"] / g.loc["ar", "steps"])}


def verify_ms(cost: dict, gamma: int) -> float:
    intercept, slope = cost["verify_line"]
    return cost["verify"].get(gamma, intercept + slope * gamma)


def drafted(stop, gamma: int, top_q: list[float]) -> int:
    """Drafts computed: a stop rule reads each drafted token's probability (a greedy draft's top one) as it is drawn and
    may end the draft after it."""
    return gamma if stop is None else next((k + 1 for k in range(gamma) if stop(top_q[: k + 1])), gamma)


def replay(policy, row: dict, cost: dict, noise: float, seed: int) -> tuple[int, float, int]:
    """Tokens, milliseconds and steps of one answer decoded under ``policy``."""
    rng = torch.Generator().manual_seed(seed)
    head = SimpleNamespace(name="head")
    answer, lengths = row["answer"], row["L"]
    pos, ms, steps = 0, 0.0, 0
    while pos < len(answer):
        choice = policy.choose(head, answer[:pos])
        gamma = drafted(choice.stop, choice.gamma, row["top_q"][pos]) if choice.gamma else 0
        jitter = 1 + noise * float(torch.randn(1, generator=rng))
        draft = (cost["draft"][0] + cost["draft"][1] * gamma) * jitter if gamma else 0.0
        if gamma == 0:
            verify, accepted = cost["plain"] * jitter, 0
        else:
            verify = verify_ms(cost, gamma) * jitter
            accepted = min(gamma, lengths[pos])
        emitted = min(accepted + 1, len(answer) - pos)
        confidence = tuple(row["top_q"][pos][:gamma]) if choice.stop else ()  # what the stop rule read
        policy.observe(Outcome(gamma, accepted, draft, verify, emitted, draft + verify, None, "head", confidence))
        pos, ms, steps = pos + emitted, ms + draft + verify, steps + 1
    return pos, ms, steps


class Clairvoyant(LengthPolicy):
    """Knows the future: drafts exactly the tokens that will be accepted (γ = L[t]; a plain step when L[t] = 0),
    the ceiling of any length policy for this draft."""

    def __init__(self, lengths: list[int]):
        super().__init__(0)
        self.lengths = lengths

    def choose(self, drafter, tokens: list[int]) -> Choice:
        gamma = self.lengths[len(tokens)]
        return Choice(gamma, partial(dict, policy="clairvoyant", gamma=gamma))


class Stopping(LengthPolicy):
    """``policy`` with transformers' confidence stop (the ``confidence`` policy's rule) on top."""

    def __init__(self, policy: LengthPolicy, threshold: float):
        self.policy, self.stop = policy, ConfidencePolicy(threshold=threshold).stop_rule

    def choose(self, drafter, tokens: list[int]) -> Choice:
        return replace(self.policy.choose(drafter, tokens), stop=self.stop)

    def observe(self, outcome: Outcome) -> None:
        self.policy.observe(outcome)


def main_replay(out: Path, matches: Path = MATCHES, costs: Path = COSTS, noise: float = 0.03, command: str = "") -> None:
    rows, cost = json.loads(matches.read_text()), cost_model(costs)
    start = DecodeConfig.gamma  # every adaptive policy starts where the CLI's would
    makers = {f"fixed γ={g}": (lambda row, g=g: GAMMA_POLICIES["fixed"](g)) for g in range(1, 9)}
    profile = {0: cost["plain"]} | {g: verify_ms(cost, g) for g in range(1, MAX_GAMMA + 1)}  # what a run measures at load
    makers |= {name: (lambda row, name=name: make_policy(name, start, profile=profile)) for name in ("fsm", "hf-heuristic", "online")}
    makers["online, the paper's (no calibrated stop)"] = lambda row: OnlinePolicy(start, profile=profile, calibrated_stop=False)
    makers["online without a profile (as on a GPU)"] = lambda row: OnlinePolicy(start)
    makers |= {f"online h={h}": (lambda row, h=h: OnlinePolicy(start, h=h, profile=profile)) for h in (5, 10, 40)}
    makers |= {f"online prior 0.5 ×{w}": (lambda row, w=w: OnlinePolicy(start, prior_weight=w, profile=profile))
               for w in (0, 2, 4)}  # default ×1
    makers |= {f"online prior = predicted acceptance ×{w}":
               (lambda row, w=w: OnlinePolicy(start, prior=row["predicted_acceptance"], prior_weight=w, profile=profile))
               for w in (1, 2, 4)}
    makers |= {f"confidence τ={t}": (lambda row, t=t: ConfidencePolicy(threshold=t)) for t in (0.2, 0.3, 0.4, 0.5)}
    makers |= {f"online + stop τ={t}": (lambda row, t=t: Stopping(OnlinePolicy(start, profile=profile), t)) for t in (0.2, 0.3, 0.4)}
    makers |= {f"fixed γ={g} + stop τ={t}": (lambda row, g=g, t=t: Stopping(GAMMA_POLICIES["fixed"](g), t))
               for g in (3, 4, 6) for t in (0.2, 0.3)}
    makers["clairvoyant (γ = the accepted length)"] = lambda row: Clairvoyant(row["L"])
    rates = {name: [] for name in makers}
    totals = {name: [0, 0.0, 0] for name in makers}
    for k, row in enumerate(rows):
        for name, make in makers.items():
            n, ms, steps = replay(make(row), row, cost, noise, seed=k)
            rates[name].append(n / ms)
            totals[name] = [a + b for a, b in zip(totals[name], (n, ms, steps))]
    fixed = [n for n in makers if n.startswith("fixed") and "stop" not in n]
    best = max(fixed, key=lambda n: totals[n][0] / totals[n][1])  # the one γ that is fastest over the whole suite
    oracle = [max(rates[n][k] for n in fixed) for k in range(len(rows))]
    summed = {n: t[0] / t[1] for n, t in totals.items()}

    def median_ratio(a: list[float], b: list[float]) -> float:
        return statistics.median(x / y for x, y in zip(a, b))

    lines = [f"# Length policies replayed on recorded match lengths (feature head, {len(rows)} prompts, {NEW_TOKENS} tokens)", "",
             f"`{command}`; match lengths from `{matches}`; cost model (ms per step, fitted to `{costs}`): "
             f"verify {', '.join(f'{v:.1f}' for v in cost['verify'].values())} at γ = {', '.join(map(str, cost['verify']))} "
             f"(longer: {cost['verify_line'][0]:.1f} + {cost['verify_line'][1]:.2f}·γ), "
             f"draft {cost['draft'][0]:.2f} + {cost['draft'][1]:.2f}"
             f"·(drafts computed), plain step {cost['plain']:.1f}; timings jittered by {noise:.0%}.", "",
             f"Best fixed γ (summed over the suite): {best}.", "",
             "| policy | tokens/step | vs best fixed γ (median per prompt) | vs best fixed γ (summed) "
             "| vs hf-heuristic (median per prompt) |",
             "|---|---|---|---|---|"]
    for name in makers:
        lines.append(f"| {name} | {totals[name][0] / totals[name][2]:.2f} | {median_ratio(rates[name], rates[best]):.3f} | "
                     f"{summed[name] / summed[best]:.3f} | {median_ratio(rates[name], rates['hf-heuristic']):.3f} |")
    lines.append(f"| best fixed γ per prompt (hindsight) | | {median_ratio(oracle, rates[best]):.3f} | | "
                 f"{median_ratio(oracle, rates['hf-heuristic']):.3f} |")
    lines += ["", "The acceptance predictor against the head's measured acceptance (censored MLE of the match lengths at γ = 10):",
              "", "| category | predicted (mean) | measured (mean) |", "|---|---|---|"]
    for category in sorted({r["category"] for r in rows}):
        group = [r for r in rows if r["category"] == category]
        measured = [sum(min(n, DEPTH) for n in r["L"]) / max(1, sum(min(n, DEPTH) + (n < DEPTH) for n in r["L"])) for r in group]
        lines.append(f"| {category} | {statistics.mean(r['predicted_acceptance'] for r in group):.2f} | {statistics.mean(measured):.2f} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record the head's match lengths on every suite prompt")
    rec.add_argument("--out", type=Path, required=True, help="the matches file (JSON)")
    rep = sub.add_parser("replay", help="replay the length policies on recorded match lengths")
    rep.add_argument("--matches", type=Path, default=MATCHES, help=f"the matches file `record` wrote (default {MATCHES})")
    rep.add_argument("--costs", type=Path, default=COSTS, help=f"a --configs policies benchmark CSV for the cost model (default {COSTS})")
    rep.add_argument("--noise", type=float, default=0.03, help="relative jitter of the modelled step times (default 0.03)")
    rep.add_argument("--out", type=Path, required=True, help="the report (Markdown)")
    a = ap.parse_args()
    if a.command == "record":
        record(a.out)
    else:
        command = shlex.join(["PYTHONPATH=.", ".venv/bin/python", "scripts/simulate_policies.py", *sys.argv[1:]])
        main_replay(a.out, a.matches, a.costs, a.noise, command=command)
