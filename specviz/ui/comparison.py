"""A comparison as the app shows it, with no gradio: its configurations (a table whose columns are the settings a
run may vary; the settings its AR baseline reads are shared), ready-made ones written as configs from the strategy
registries, every run's record by round, the metrics table and the CSV / JSON / trace exports."""

from __future__ import annotations

import csv
import json
import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from specviz.api.trace import Trace
from specviz.bench.harness import GENERATE_KERNELS, generate_figure
from specviz.core.errors import ConfigError
from specviz.core.policy import MAX_GAMMA
from specviz.core.record import SPANS
from specviz.core.registry import ACCEPT_RULES, GAMMA_POLICIES
from specviz.models.presets import NGRAM_DRAFT, resolve_draft, resolve_preset
from specviz.runtime.config import DecodeConfig
from specviz.runtime.prepare import BASELINE_SETTINGS, drafter_kind
from specviz.ui.bank import available_drafts, default_draft
from specviz.ui.exports import export_folder
from specviz.ui.runs import AR_LABEL, Live
from specviz.ui.state import form_config
from specviz.viz import charts
from specviz.viz.export import generate_series, run_label
from specviz.viz.render import GENERATE, TokenSpan, column_html, columns_html, spans_html

SETTINGS = DecodeConfig.settings()
ROW_SETTINGS = [name for name in SETTINGS if name not in BASELINE_SETTINGS]
"""A configuration row's settings: every setting but those its AR baseline reads, which all rows share."""
CONFIG_COLUMNS = ["label", *(SETTINGS[name].label or name for name in ROW_SETTINGS)]
COLUMN_SETTINGS = {**{SETTINGS[name].label or name: name for name in ROW_SETTINGS}, **{name: name for name in ROW_SETTINGS}}
"""A column's setting, by its header: the setting's label or its name."""
MAX_CONFIGS = 4
METRIC_COLUMNS = ["config", "run order", "new tokens", "wall s", "tok/s", "speedup vs AR", "speedup vs transformers generate",
                  "mean accepted len", "accept rate", "draft ms", "verify ms", "overhead ms", "same tokens as AR"]
GENERATE_LABEL = f"{GENERATE} (stock kernels)"
"""The column of transformers' generate on the AR baseline's settings, timed in the same rounds."""
SERVER_LABEL = "vLLM server"
"""The column of a vLLM server's run of the prompt with the AR baseline's sampling settings, in the same rounds."""
SERVER_COMPARISON = "draft-m γ=3: specviz against vLLM with the same draft (a server from `make vllm SPEC=draft-m`)"
"""The ready-made comparison with a server column: specviz's draft-m chain at γ 3 beside vLLM's run of the same draft."""
SERVER_SPEC = {"method": "draft_model", "model": "assets/models/smollm2-draft-m", "num_speculative_tokens": 3}


POLICY_DUEL = ("online", "fsm", "hf-heuristic")
"""The adaptive γ policies of the comparison Compare opens on, beside fixed γ at its best."""


def comparison_presets(preset: str) -> dict[str, list[tuple[str, DecodeConfig]]]:
    """Ready-made comparisons (labelled configs) for the 'load a comparison' dropdown. The first, which Compare opens
    on, sets γ policies side by side on the preset's default draft: fixed at the preset's best measured γ, then
    :data:`POLICY_DUEL`. Then the draft against the n-gram drafter, a γ sweep, the other registered γ policies and every
    acceptance rule against the defaults, and a chain when the preset has a draft model (a feature head drafts from the
    target's states, so it cannot be a level)."""
    d, g = default_draft(preset), DecodeConfig.gamma
    best = resolve_preset(preset).fixed_gamma or g

    def sd(**kw: Any) -> DecodeConfig:
        return DecodeConfig(preset=preset, **{"draft": d, **kw})

    def groups(names: list[str], first: tuple[str, DecodeConfig], config_of) -> list[list[tuple[str, DecodeConfig]]]:
        size = MAX_CONFIGS - 1
        return [[first, *((n, config_of(n)) for n in names[i:i + size])] for i in range(0, len(names), size)]

    fixed = (f"fixed γ={best}", sd(gamma=best, gamma_policy="fixed"))
    tables = {f"γ policies on {d}: fixed γ={best}, {', '.join(POLICY_DUEL)}": [fixed, *((p, sd(gamma_policy=p)) for p in POLICY_DUEL)]}
    if d != NGRAM_DRAFT:
        tables[f"{d} vs n-gram (γ={best})"] = [(f"{d} γ={best}", fixed[1]), (f"{NGRAM_DRAFT} γ={best}", sd(draft=NGRAM_DRAFT, gamma=best))]
    sweep = sorted({1, best, min(MAX_GAMMA, 2 * best + 1)})
    tables[f"γ sweep ({', '.join(map(str, sweep))})"] = [(f"{d} γ={x}", sd(gamma=x, gamma_policy="fixed")) for x in sweep]
    others = [p for p in GAMMA_POLICIES if p not in ("fixed", *POLICY_DUEL)]
    for rows in groups(others, fixed, lambda p: sd(gamma_policy=p)):
        tables["more γ policies: " + ", ".join(label for label, _ in rows)] = rows
    exact = DecodeConfig.accept
    for rows in groups([r for r in ACCEPT_RULES if r != exact], (exact, fixed[1]), lambda r: replace(fixed[1], accept=r)):
        tables["acceptance rules: " + ", ".join(label for label, _ in rows)] = rows
    models = [x for x in available_drafts(preset) if not drafter_kind(resolve_draft(resolve_preset(preset), x)).reads_features]
    chain_draft = next((x for x in models if x != NGRAM_DRAFT), None)
    if chain_draft:
        tables["plain SD vs polybasic chain"] = [(f"{chain_draft} γ={best}", sd(draft=chain_draft, gamma=best, gamma_policy="fixed")),
                                                 (f"{NGRAM_DRAFT}→{chain_draft} chain",
                                                  sd(draft=None, chain=[NGRAM_DRAFT, chain_draft], gamma=best, gamma_policy="fixed"))]
    return tables


SHOWN_ALWAYS = ("draft", "gamma_policy", "gamma")
TREE_SETTINGS = ("tree_nodes", "tree_branch", "tree_kind")


def shown_settings(configs: list[tuple[str, DecodeConfig]]) -> list[str]:
    """The settings a table of these rows shows: the draft, the γ policy and γ, every setting a row's γ policy or
    acceptance rule reads, a tree's shape where a row drafts trees, a chain's level γ, and any other setting a row sets
    away from its default; the rest are left at their defaults and can be added as columns by name."""
    defaults = DecodeConfig()
    read = {p for _, c in configs for p in reads(c)}
    return [name for name in ROW_SETTINGS if name in SHOWN_ALWAYS or name in read
            or any(getattr(c, name) != getattr(defaults, name) for _, c in configs)]


def reads(c: DecodeConfig) -> set[str]:
    """The settings that only some rows read which ``c`` reads: its γ policy's and acceptance rule's, a tree's shape,
    a chain's level γ."""
    return {*GAMMA_POLICIES.entry(c.gamma_policy).params, *ACCEPT_RULES.entry(c.accept).params,
            *(TREE_SETTINGS if c.tree_nodes else ()), *(("level_gamma",) if c.chain else ())}


OPTIONAL = {*(p for r in (GAMMA_POLICIES, ACCEPT_RULES) for e in r.entries() for p in e.params), *TREE_SETTINGS, "level_gamma"}
"""The settings only some rows read (see :func:`reads`)."""


def table_of(configs: list[tuple[str, DecodeConfig]], every_setting: bool = False) -> pd.DataFrame:
    """Labelled configs as the configuration table, with the :func:`shown_settings` columns (``every_setting``: all of
    them). A list is comma-separated; an unset draft, a setting the row does not read, and γ of a row that drafts a
    tree (its budget is the tree's nodes) are empty cells."""
    names = ROW_SETTINGS if every_setting else shown_settings(configs)

    def cell(c: DecodeConfig, name: str) -> Any:
        value = getattr(c, name)
        if (name == "gamma" and c.tree_nodes) or (name in OPTIONAL and name not in reads(c) and value == getattr(DecodeConfig, name)):
            return ""
        return ",".join(value) if isinstance(value, list) else "" if value is None else value

    return pd.DataFrame([[label, *(cell(c, name) for name in names)] for label, c in configs],
                        columns=["label", *(SETTINGS[name].label or name for name in names)])


def default_table(preset: str) -> pd.DataFrame:
    return table_of(next(iter(comparison_presets(preset).values())))


def _filled(value: Any) -> bool:
    return not (value is None or (isinstance(value, float) and value != value) or (isinstance(value, str) and not value.strip()))


def parse_table(table: Any, shared: dict) -> list[tuple[str, DecodeConfig]]:
    """(label, validated config) per non-empty row of the table, with the ``shared`` settings; an empty cell is the
    setting's default; errors name the row."""
    df = table if isinstance(table, pd.DataFrame) else pd.DataFrame(table or [], columns=CONFIG_COLUMNS)
    unknown = [str(h) for h in df.columns if h != "label" and h not in COLUMN_SETTINGS]
    if unknown:
        raise ConfigError(f"unknown column '{unknown[0]}'; columns: {', '.join(CONFIG_COLUMNS)}")
    configs = []
    for _, row in df.iterrows():
        cells = {h: v for h, v in row.items() if _filled(v)}
        if not cells:
            continue
        label = str(cells.pop("label", f"config {len(configs) + 1}"))
        try:
            config = form_config({**shared, **{COLUMN_SETTINGS[h]: v for h, v in cells.items()}})
        except ConfigError as exc:
            raise ConfigError(f"configuration row {len(configs) + 1} ({label}): {exc}") from None
        configs.append((label, config))
    if not configs:
        raise ConfigError("add at least one configuration to the table")
    if len(configs) > MAX_CONFIGS:
        raise ConfigError(f"compare at most {MAX_CONFIGS} configurations at once, got {len(configs)}")
    labels = [label for label, _ in configs]
    if len(set(labels)) != len(labels) or {AR_LABEL, GENERATE_LABEL, SERVER_LABEL} & set(labels):
        raise ConfigError("give every configuration its own label")
    return configs


class Comparison:
    """The runs of one comparison: per label, every round's record; the first round's runs are displayed."""

    def __init__(self, prompt: str, labels: list[str], configs: dict[str, DecodeConfig], n_rounds: int = 1,
                 server: dict | None = None):
        self.prompt, self.labels, self.configs, self.n_rounds, self.server = prompt, labels, configs, n_rounds, server
        self.rounds: dict[str, list[dict]] = {label: [] for label in labels}
        self.lives: dict[str, Live] = {}
        """Per label, its first round's run."""
        self.order: list[str] = []
        self.views: dict[str, dict] = {}
        """Per label (first round): the step panel's view, growing with the run, then its trace with the AR baseline."""
        self.generate_error: str | None = None
        """Why transformers' generate failed, if it did (its later rounds are skipped)."""
        self.server_chunks: list[list] = []
        """The server's first round as it streamed: [seconds, tokens, html] per chunk, the last one its steps' spans."""
        self.server_error: str | None = None
        """Why the server's run failed, if it did (its later rounds are skipped)."""

    def chunks(self) -> dict[str, list[list]]:
        shown = {label: live.chunks for label, live in self.lives.items()}
        first = (self.rounds.get(GENERATE_LABEL) or [None])[0]
        if first:  # known only once it has finished: its whole text at its end
            shown[GENERATE_LABEL] = [[first["metrics"]["wall_s"], first["metrics"]["new_tokens"],
                                      spans_html([TokenSpan(first["text"], "target", 1)])]]
        elif self.generate_error:
            shown[GENERATE_LABEL] = []
        if self.server_chunks or self.server_error:
            shown[SERVER_LABEL] = self.server_chunks
        return shown

    def descriptions(self) -> dict[str, str]:
        shown = {label: run_label(self.configs[label].to_dict()) for label in self.labels}
        if GENERATE_LABEL in shown:
            shown[GENERATE_LABEL] = f"failed: {self.generate_error}" if self.generate_error else f"AR on {GENERATE_KERNELS}"
        if SERVER_LABEL in shown:
            shown[SERVER_LABEL] = (f"failed: {self.server_error}" if self.server_error else
                                   f"the server's speculation at {self.server['url']}: its own engine; its metrics are the "
                                   "times the server reports, the race its tokens as this app received them")
        return shown

    def generate_figure(self) -> dict | None:
        """transformers' generate's first round beside AR's, as a trace keeps it (None if it was not timed)."""
        first, ar = (self.rounds.get(GENERATE_LABEL) or [None])[0], (self.rounds.get(AR_LABEL) or [None])[0]
        if not first or not ar:
            return None
        return generate_figure({**first["metrics"], "token_ids": first["token_ids"]}, ar["token_ids"],
                               self.configs[AR_LABEL].temperature > 0)

    def columns(self, at_s: float | None = None) -> str:
        return columns_at(self.labels, self.chunks(), self.descriptions(), at_s)

    def race(self):
        shown = {**{label: live.chunks for label, live in self.lives.items()}, SERVER_LABEL: self.server_chunks}
        series = [charts.Series(label, [0.0] + [c[0] for c in chunks], [0] + [c[1] for c in chunks], baseline=label == AR_LABEL)
                  for label, chunks in shown.items() if chunks]
        return charts.race_figure(series + generate_series(self.generate_figure()),
                                  "All configurations: tokens vs wall-clock time (first round)")

    def max_time(self) -> float:
        return max((chunks[-1][0] for chunks in [*(live.chunks for live in self.lives.values()), self.server_chunks] if chunks),
                   default=0.0)


def columns_at(labels: list[str], chunks: dict[str, list[list]], descriptions: dict[str, str], at_s: float | None = None) -> str:
    """One column per configuration; with ``at_s``, each shows only what its run had produced by then."""
    cols = []
    for label in labels:
        shown = [c for c in chunks.get(label, []) if at_s is None or c[0] <= at_s + 1e-9]
        if label not in chunks:
            sub = f"{descriptions[label]} · waiting"
        else:
            when = f" at {at_s:.2f} s" if at_s is not None else ""
            sub = f"{descriptions[label]} · {shown[-1][1] if shown else 0} tokens{when}"
        cols.append(column_html(label, sub, "".join(c[2] for c in shown)))
    return columns_html(cols)


def _ratios(recs: list[dict], peers: list[dict]) -> float | None:
    """The median of per-round tokens/s ratios of ``recs`` to ``peers`` (same round)."""
    ratios = [r["metrics"]["tokens_per_s"] / a["metrics"]["tokens_per_s"] for r, a in zip(recs, peers) if a["metrics"]["tokens_per_s"] > 0]
    return round(statistics.median(ratios), 3) if ratios else None


def metrics_table(comp: Comparison) -> pd.DataFrame:
    """Medians over rounds; speedups are medians of per-round ratios to AR and to transformers' generate (same round);
    transformers' generate has no steps, so no step metrics."""
    rows = []
    ar_rounds, hf_rounds = comp.rounds.get(AR_LABEL, []), comp.rounds.get(GENERATE_LABEL, [])
    for label in comp.labels:
        recs = comp.rounds[label]
        if not recs:
            continue

        def med(key: str, digits: int, recs: list[dict] = recs) -> float | None:
            values = [r["metrics"][key] for r in recs if key in r["metrics"]]
            return round(statistics.median(values), digits) if values else None

        drafted = any(r["metrics"].get("drafted") for r in recs)
        positions = [str(comp.order.index(f"{label}#{k + 1}") + 1) for k in range(len(recs)) if f"{label}#{k + 1}" in comp.order]
        same = all(r["token_ids"] == a["token_ids"] for r, a in zip(recs, ar_rounds)) if ar_rounds else None
        rows.append([label, ",".join(positions), int(med("new_tokens", 0)), med("wall_s", 3), med("tokens_per_s", 2),
                     _ratios(recs, ar_rounds), _ratios(recs, hf_rounds), med("mean_accept_len", 3),
                     med("accept_rate", 3) if drafted else None, med("draft_ms", 1), med("verify_ms", 1),
                     med("overhead_ms", 1), "–" if same is None else ("yes" if same else "no")])
    return pd.DataFrame(rows, columns=METRIC_COLUMNS)


def view_key(label: str) -> str:
    return f"compare: {label}"


def save_column_traces(comp: Comparison, session: dict) -> list[str]:
    """Each column's first run as a trace file (with the AR run as its baseline); the step panel shows them."""
    folder, paths = export_folder(), []
    ar = comp.views.get(AR_LABEL)
    for i, label in enumerate(comp.labels):
        view = comp.views.get(label)
        if view is None or "spans" not in view:
            continue
        view["baseline"] = {k: v for k, v in ar.items() if k not in ("follow", "selector")} if ar and label != AR_LABEL else None
        if comp.generate_figure():
            view["transformers"] = comp.generate_figure()
        session["views"][view_key(label)] = view
        path = folder / f"specviz-compare-{i + 1}-{re.sub(r'[^a-z0-9]+', '-', label.lower()).strip('-')[:40]}.json"
        Trace.from_dict({k: v for k, v in view.items() if k not in ("follow", "selector")}).save(path)
        paths.append(str(path))
    return paths


def export(comp: Comparison, shared: dict, warmup_tokens: int) -> tuple[Path, Path]:
    """Every step of every run as CSV, and the whole comparison as JSON, in a fresh temp folder."""
    folder = export_folder()
    fields = ["config", "round", "order", *ROW_SETTINGS, "step", "drafter", "gamma", "drafted", "accepted", "emitted",
              "accept_reasons", *(f"{k}_ms" for k in SPANS), "total_ms", "elapsed_ms"]
    csv_path, json_path = folder / "specviz-compare-steps.csv", folder / "specviz-compare.json"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for label in comp.labels:
            for rec in comp.rounds[label]:
                c = rec["config"]
                settings = [",".join(c[n]) if isinstance(c[n], list) else c[n] for n in ROW_SETTINGS]
                for e in rec["events"]:
                    w.writerow([label, rec["round"], rec["order"], *settings, e["step"], e["drafter"], e["gamma"], e["drafted"],
                                e["accepted"], len(e["emitted_ids"]), " ".join(e["accept_reasons"]),
                                *(round(e["spans"][k], 3) for k in SPANS), round(e["total_ms"], 3), round(e["elapsed_ms"], 3)])
    summary = metrics_table(comp)
    payload = {"prompt": comp.prompt, "shared": shared, "order": comp.order, "warmup_tokens": warmup_tokens,
               "summary": json.loads(summary.to_json(orient="records")),
               "runs": [rec for label in comp.labels for rec in comp.rounds[label]]}
    json_path.write_text(json.dumps(payload, indent=1, default=str))
    return csv_path, json_path
