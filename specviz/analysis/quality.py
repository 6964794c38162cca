"""Quality of an output when the method is not lossless: whether it answers a verifiable question
(:func:`is_correct`) and the target's own log-likelihood of it."""

from __future__ import annotations

import html
import math
import re
import statistics

import torch

from specviz.models.loaded import LoadedModel


@torch.inference_mode()
def target_logprob(target: LoadedModel, prompt_ids: list[int], output_ids: list[int]) -> float:
    """Mean log p_target(token | prefix) over ``output_ids`` (temperature 1), in one cache-free forward."""
    if not output_ids:
        return float("nan")
    ids = torch.tensor([prompt_ids + output_ids], device=target.device)
    logits = target.model(input_ids=ids, use_cache=False).logits[0, len(prompt_ids) - 1: -1, : target.vocab_size]
    logp = logits.float().log_softmax(-1)
    return logp[torch.arange(len(output_ids)), torch.tensor(output_ids, device=logp.device)].mean().item()


def quality_table(rows: list[dict], labels: list[str]) -> list[dict]:
    """Speed next to quality per configuration; the first label is the reference: exact greedy SD, whose
    outputs are the target's own (lossless), so its accuracy is the target's."""
    def of(label: str) -> list[dict]:
        return [r for r in rows if r["config"] == label]

    ref_len = statistics.mean(r["mean_accept_len"] for r in of(labels[0]))
    target_acc = 100 * statistics.mean(bool(r["correct"]) for r in of(labels[0]))
    out = []
    for label in labels:
        rs = of(label)
        acc = 100 * statistics.mean(bool(r["correct"]) for r in rs)
        mean_len = statistics.mean(r["mean_accept_len"] for r in rs)
        out.append({"config": label, "mean accepted len": mean_len, f"accepted len / {labels[0]}": mean_len / ref_len,
                    "tok/s (median)": statistics.median(r["tokens_per_s"] for r in rs),
                    f"speedup vs {labels[0]} (median)": statistics.median(r["speedup"] for r in rs),
                    "accuracy %": acc, f"Δ accuracy vs {labels[0]} = target (points)": acc - target_acc,
                    "target log-lik / token": statistics.mean(r["target_logprob"] for r in rs)})
    return out


def speed_quality_svg(table: list[dict], width: int = 560, height: int = 360) -> str:
    """A dependency-free scatter: accepted length relative to the reference (x) against accuracy (y)."""
    x_key, y_key, pad = next(k for k in table[0] if k.startswith("accepted len /")), "accuracy %", 60
    xs, ys = [r[x_key] for r in table], [r[y_key] for r in table]
    x0, x1 = min(xs + [1.0]) * 0.95, max(xs) * 1.05
    y0, y1 = max(0.0, min(ys) - 5), min(100.0, max(ys) + 5)

    def sx(x: float) -> float:
        return pad + (x - x0) / (x1 - x0 or 1) * (width - 2 * pad)

    def sy(y: float) -> float:
        return height - pad - (y - y0) / (y1 - y0 or 1) * (height - 2 * pad)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
             f'<text x="{width / 2}" y="{height - 20}" text-anchor="middle">{html.escape(x_key)} (speed)</text>',
             f'<text x="16" y="{height / 2}" transform="rotate(-90 16 {height / 2})" text-anchor="middle">accuracy % (quality)</text>']
    for tick in (x0, (x0 + x1) / 2, x1):
        parts.append(f'<text x="{sx(tick):.1f}" y="{height - pad + 14}" text-anchor="middle">{tick:.2f}</text>')
    for tick in (y0, (y0 + y1) / 2, y1):
        parts.append(f'<text x="{pad - 6}" y="{sy(tick) + 4:.1f}" text-anchor="end">{tick:.0f}</text>')
    for r, x, y in zip(table, xs, ys):
        parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="#4c6ef5"/>')
        parts.append(f'<text x="{sx(x) + 6:.1f}" y="{sy(y) - 6:.1f}">{html.escape(r["config"])}</text>')
    return "\n".join([*parts, "</svg>"])


_NUMBER = re.compile(r"(?<![\w.])[-−]?\d+(?:,\d{3})*(?:\.\d+)?")


_NUMERIC = re.compile(r"\s*([-−]?\d[\d,]*(?:\.\d+)?)\s*[^\d\s]*\s*")


def numbers(text: str) -> list[tuple[int, float]]:
    """(offset, value) of every number in ``text``; thousands commas are allowed ("1,250" -> 1250)."""
    return [(m.start(), float(m.group().replace(",", "").replace("−", "-"))) for m in _NUMBER.finditer(text)]


def as_number(s: str) -> float | None:
    m = _NUMERIC.fullmatch(s)
    return float(m.group(1).replace(",", "").replace("−", "-")) if m else None


def is_correct(text: str, expected: list[str]) -> bool:
    """True if ``text`` gives one of the ``expected`` answers. A numeric one (units after it are ignored)
    must equal the LAST number of the text; any other must occur as a whole word or phrase, ignoring case."""
    found = numbers(text)
    for want in expected:
        value = as_number(want)
        if value is None:
            if re.search(rf"(?<!\w){re.escape(want)}(?!\w)", text, re.IGNORECASE):
                return True
        elif found and math.isclose(found[-1][1], value, rel_tol=1e-9, abs_tol=1e-9):
            return True
    return False
