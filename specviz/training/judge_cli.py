"""``python -m specviz judge build|train|eval``: features from the dataset, the head, its held-out report.

    python -m specviz judge build                    # assets/judge/{dataset,decisions}.jsonl -> .cache/judge/features.pt
    python -m specviz judge train                    # split "train" -> assets/judges/<target>.json, report on "heldout"
    python -m specviz judge eval [--out PATH]        # held-out report -> out/judge_eval.md unless --out
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specviz.core.errors import ConfigError
from specviz.methods.judge import JudgeHead, default_head_path
from specviz.models.paths import ASSETS
from specviz.models.presets import OFFLINE_PRESET, resolve_preset
from specviz.training.judge_fit import (
    DEFAULT_DECISION_WEIGHT,
    DEFAULT_JUNK_WEIGHT,
    DEFAULT_L2,
    build_features,
    evaluate,
    report_markdown,
    roc_auc,
    sample_weights,
    token_kinds,
    train_head,
)

DATASET = ASSETS / "judge" / "dataset.jsonl"
DECISIONS = ASSETS / "judge" / "decisions.jsonl"
FEATURES = Path(".cache/judge/features.pt")
EVAL_OUT = Path("out/judge_eval.md")
"""``judge eval``'s report unless ``--out`` names one (``out/`` is not committed)."""
FIELDS = {"id": str, "category": str, "question": str, "answer": str, "split": str, "source": str}
SWEEP = (0.1, 0.3, 0.5, 0.7, 0.9)


def register(subparsers: argparse._SubParsersAction) -> None:
    j = subparsers.add_parser("judge", help="build features, train and evaluate the judge head (judge decoding)")
    sub = j.add_subparsers(dest="judge_command", metavar="build|train|eval", required=True, parser_class=type(j))
    b = sub.add_parser("build", help="pre-norm target states + labels of every dataset token")
    b.add_argument("--dataset", type=Path, nargs="+", default=[DATASET, DECISIONS],
                   help="JSONL files: TokenCourt-style items and/or outcome-labelled decisions")
    b.add_argument("--preset", default=OFFLINE_PRESET)
    b.add_argument("--no-chat", action="store_true", help="do not apply the chat template to the questions")
    b.add_argument("--out", type=Path, default=FEATURES)
    t = sub.add_parser("train", help="fit the head on split 'train', report on 'heldout'")
    t.add_argument("--features", type=Path, default=FEATURES)
    t.add_argument("--out", type=Path, default=None, help="default: assets/judges/<target>.json")
    t.add_argument("--l2", type=float, default=DEFAULT_L2, help="L2 penalty on the standardised weights")
    t.add_argument("--junk-weight", type=float, default=DEFAULT_JUNK_WEIGHT,
                   help="weight of the first errors of draft-junk items (on top of class weighting)")
    t.add_argument("--decision-weight", type=float, default=DEFAULT_DECISION_WEIGHT,
                   help="weight of the outcome-labelled decision tokens (on top of class weighting)")
    t.add_argument("--epochs", type=int, default=500, help="L-BFGS iterations at most")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threshold", type=float, default=0.5)
    t.add_argument("--no-confidence", dest="confidence", action="store_false",
                   help="the paper's head: pre-norm states only, without the target's log p of the token and top log p")
    e = sub.add_parser("eval", help="evaluate a head on the held-out tokens and write a Markdown report")
    e.add_argument("--features", type=Path, default=FEATURES)
    e.add_argument("--head", type=Path, default=None, help="default: assets/judges/<target>.json")
    e.add_argument("--threshold", type=float, default=0.5)
    e.add_argument("--out", type=Path, default=EVAL_OUT, help=f"the Markdown report (default {EVAL_OUT})")


def run(args: argparse.Namespace) -> int:
    return {"build": cmd_build, "train": cmd_train, "eval": cmd_eval}[args.judge_command](args)


def _row(line: str, n: int) -> dict:
    try:
        row = json.loads(line)
    except ValueError:
        raise ConfigError(f"line {n}: not JSON") from None
    if not isinstance(row, dict):
        raise ConfigError(f"line {n}: not a JSON object")
    bad = [k for k, kind in FIELDS.items() if not isinstance(row.get(k), kind)]
    if bad:
        raise ConfigError(f"line {n}: missing or mistyped field(s) {', '.join(bad)}")
    if "answer_ids" in row:
        ids, label = row["answer_ids"], row.get("label")
        if not (isinstance(ids, list) and ids and all(isinstance(t, int) and t >= 0 for t in ids)) or label not in (0, 1):
            raise ConfigError(f"line {n}: a decision needs answer_ids (token ids) and a label of 0 or 1")
        row["error_at"] = None
    at = row.get("error_at")
    if at is not None and not (isinstance(at, int) and 0 <= at < len(row["answer"])):
        raise ConfigError(f"line {n}: error_at must be null or a character offset inside the answer, got {at!r}")
    if row["split"] not in ("train", "heldout"):
        raise ConfigError(f"line {n}: split must be 'train' or 'heldout', got {row['split']!r}")
    return row


def read_dataset(path: Path) -> list[dict]:
    """Rows of a judge dataset file (JSONL), checked; raises ConfigError with the offending line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the judge dataset {path}: {exc.strerror}") from None
    try:
        rows = [_row(line, n) for n, line in enumerate(lines, 1) if line.strip()]
    except ConfigError as exc:
        raise ConfigError(f"{path.name} {exc}") from None
    if not rows:
        raise ConfigError(f"the judge dataset {path} is empty")
    return rows


def load_features(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"no features at {path}: run `python -m specviz judge build` first")
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # pickle/zip errors have long, varied messages
        raise ConfigError(f"cannot read features {path}: {type(exc).__name__}") from None


def _split(feats: dict, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mask = torch.tensor([s == name for s in feats["split"]], dtype=torch.bool)
    return feats["X"][mask], feats["y"][mask], feats["item"][mask]


def cmd_build(a: argparse.Namespace) -> int:
    from specviz.runtime.bank import ModelBank

    items = [row for path in a.dataset for row in read_dataset(path)]
    preset, bank = resolve_preset(a.preset), ModelBank()
    tokenizer = bank.tokenizer(preset.target)
    lm = bank.target(preset)
    start = time.perf_counter()
    feats = build_features(lm, tokenizer, items, chat=not a.no_chat)
    feats["dataset"] = ", ".join(p.name for p in a.dataset)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(feats, a.out)
    y = feats["y"]
    print(f"{len(items)} items -> {len(y)} tokens ({int(y.sum())} acceptable, {len(y) - int(y.sum())} first errors) "
          f"of {lm.name} in {time.perf_counter() - start:.1f}s -> {a.out}")
    return 0


def cmd_train(a: argparse.Namespace) -> int:
    feats = load_features(a.features)
    X, y, item = _split(feats, "train")
    if not 0 < int(y.sum()) < len(y):
        raise ConfigError(f"split 'train' of {a.features} needs both acceptable and erroneous tokens")
    hidden = feats["hidden_size"]
    if a.confidence and X.shape[1] != hidden + 2:
        raise ConfigError(f"{a.features} has no confidence features: rerun `python -m specviz judge build` (or train --no-confidence)")
    start = time.perf_counter()
    weight = sample_weights(token_kinds(feats, item), y, a.junk_weight, a.decision_weight)
    head = train_head(X if a.confidence else X[:, :hidden], y, target=feats["target"], l2=a.l2, epochs=a.epochs, seed=a.seed,
                      sample_weight=weight, hidden_size=hidden)
    head.meta.update(items=len(item.unique()), dataset=feats["dataset"], chat=feats["chat"], junk_weight=a.junk_weight,
                     decision_weight=a.decision_weight)
    out = a.out or default_head_path(feats["target"])
    head.save(out)
    print(f"trained a {head.n_parameters}-parameter head on {len(y)} tokens in {time.perf_counter() - start:.1f}s -> {out}",
          file=sys.stderr)
    Xh, yh, ih = _split(feats, "heldout")
    print(report_markdown(evaluate(head, head.columns(Xh), yh, a.threshold, token_kinds(feats, ih))) if len(yh)
          else "no held-out tokens to report on")
    return 0


def _by_category(feats: dict, scores: torch.Tensor, y: torch.Tensor, item: torch.Tensor) -> list[str]:
    cats = [feats["categories"][i] for i in item.tolist()]
    lines = ["| category | tokens | first errors | AUC |", "|---|---|---|---|"]
    for c in sorted(set(cats)):
        m = torch.tensor([k == c for k in cats])
        auc = roc_auc(scores[m], y[m])
        lines.append(f"| {c} | {int(m.sum())} | {int((y[m] == 0).sum())} | {'n/a' if auc != auc else f'{auc:.3f}'} |")
    return lines


def _sweep(scores: torch.Tensor, y: torch.Tensor, kinds: list[str]) -> list[str]:
    good = y.bool()
    junk = torch.tensor([k.startswith("junk") for k in kinds], dtype=torch.bool)
    lines = ["| δ | acceptable tokens accepted | first errors accepted | content errors accepted | junk accepted |",
             "|---|---|---|---|---|"]
    for d in SWEEP:
        acc = scores > d
        cells = [acc[m].float().mean() if m.any() else float("nan") for m in (good, ~good, ~good & ~junk, ~good & junk)]
        lines.append(f"| {d:g} | " + " | ".join("n/a" if c != c else f"{c:.3f}" for c in cells) + " |")
    return lines


def _decisions(scores: torch.Tensor, y: torch.Tensor, kinds: list[str]) -> list[str]:
    """The judge's real decisions (outcome-labelled draft proposals): AUC and what each δ accepts."""
    m = torch.tensor([k == "decision" for k in kinds], dtype=torch.bool)
    if not m.any():
        return []
    s, good = scores[m], y[m].bool()
    lines = ["", f"Outcome-labelled decisions ({int(m.sum())} held-out draft proposals that differ from the target's token, "
             f"{int(good.sum())} of them acceptable: the target still reaches its own answer after accepting it): "
             f"ROC AUC {roc_auc(s, y[m]):.3f}.", "",
             "| δ | acceptable decisions accepted | harmful decisions accepted |", "|---|---|---|"]
    for d in SWEEP:
        acc = s > d
        cells = [acc[g].float().mean() if g.any() else float("nan") for g in (good, ~good)]
        lines.append(f"| {d:g} | " + " | ".join("n/a" if c != c else f"{c:.3f}" for c in cells) + " |")
    return lines


def _eval_command(a: argparse.Namespace) -> str:
    """The ``judge eval`` command line that writes this report (options left at their defaults omitted, ``--out`` always)."""
    options = [("--features", a.features, FEATURES), ("--head", a.head, None), ("--threshold", a.threshold, 0.5)]
    given = "".join(f" {flag} {value}" for flag, value, default in options if value != default)
    return f"python -m specviz judge eval{given} --out {a.out}"


def cmd_eval(a: argparse.Namespace) -> int:
    feats = load_features(a.features)
    path = a.head or default_head_path(feats["target"])
    head = JudgeHead.load(path, feats["target"], feats["hidden_size"])
    X, y, item = _split(feats, "heldout")
    if not len(y):
        raise ConfigError(f"{a.features} has no held-out tokens")
    X = head.columns(X)
    scores, kinds = head.score(X), token_kinds(feats, item)
    train_tokens = len(feats["y"]) - len(y)
    text = "\n".join([
        "# Judge head: held-out evaluation",
        "",
        f"Target `{head.target}` (hidden size {head.hidden_size}, {head.n_parameters} parameters: pre-norm state"
        f"{' + the target log p of the token and top log p' if head.confidence else ' only'}); head `{path.name}` trained on "
        f"{head.meta.get('tokens', '?')} tokens of {head.meta.get('items', '?')} items (l2 = {head.meta.get('l2', '?')}, "
        f"junk weight {head.meta.get('junk_weight', 1)}). "
        f"Data `{feats['dataset']}`: {train_tokens} train / {len(y)} held-out tokens, "
        f"{len(item.unique())} held-out items. Generated by `{_eval_command(a)}`.",
        "",
        report_markdown(evaluate(head, X, y, a.threshold, kinds)),
        "Held-out AUC per category:",
        "",
        *_by_category(feats, scores, y, item),
        "",
        "Acceptance by the judge alone over δ (the engine accepts a token if exact verification *or* the judge does):",
        "",
        *_sweep(scores, y, kinds),
        *_decisions(scores, y, kinds),
    ]) + "\n"
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    print(text)
    return 0
