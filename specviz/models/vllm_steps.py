"""A vLLM chat completion as the steps of a run.

vLLM emits its first token from the prefill; every later step drafted ``per_step_drafted[i]`` tokens, kept
``per_step_accepted[i]`` and emitted one more of the target's own, so the answer's token ids split into a target
step of one token and then one step per array entry. The last step may end early, at a stop token among its
accepted drafts or at ``max_tokens``: vLLM drafts its full γ there and counts every draft it accepted, emitted or
not, while the step records as accepted the drafts it emitted (as specviz's own engine does; the server's own total
stays in the trace's source). A step says what the server does not tell (:data:`UNTOLD`): its rejected
draft ids are ``null``, p and q are empty, its times are zero. vLLM lists no step that drafted nothing (an n-gram
without a match); given an n-gram server's config, its rule is replayed to place those steps and name every draft.

The answer is data: arrays that are missing, of the wrong type, disagree with the totals beside them or do not add
up to the emitted tokens raise a one-line :class:`~specviz.core.errors.ServerError`, and nothing is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specviz.core.drafters import ngram_proposal
from specviz.core.errors import ServerError
from specviz.core.record import SPANS, StepEvent, TreeRecord

UNTOLD = ["rejected_ids", "p", "q", "times"]
"""What a server's step does not say: the ids of its rejected drafts, p and q of each token, and per-step times."""

SPEC_KEYS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens", "num_spec_tokens")
TIMING_KEYS = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second")


@dataclass
class ServerAnswer:
    """What one completion told: the prompt's and the answer's ids and text, why it stopped, the speculative-decoding
    metrics as sent (checked), the timing metrics it had, and the steps."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    spec: dict
    timing: dict = field(default_factory=dict)
    steps: list[StepEvent] = field(default_factory=list)


def _ids(value: object, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise ServerError(f"the server's {what} is not a list of token ids (does it take return_token_ids? vLLM 0.10 or newer)")
    return value


def _counts(spec: dict, key: str) -> list[int]:
    value = spec.get(key)
    if value is None and spec["num_spec_steps"] == 0:  # vLLM sends null, or nothing, for no step
        return []
    if value is None:
        raise ServerError("the server reports speculation per request only as a summary: start it with "
                          "--per-request-spec-decode-metrics detailed")
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise ServerError(f"the server's {key} is not a list of counts")
    return value


def read_spec(metrics: object) -> dict:
    """``metrics.speculative_decoding``, checked: the totals are counts and the per-step arrays agree with them."""
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if spec is None:
        raise ServerError("the server sent no speculative-decoding metrics: it runs without --speculative-config, or without "
                          "--per-request-spec-decode-metrics (or it is not vLLM 0.32 or newer)")
    if not isinstance(spec, dict) or not all(isinstance(spec.get(k), int) and spec[k] >= 0 for k in SPEC_KEYS):
        raise ServerError("the server's speculative_decoding metrics do not have vLLM's counts")
    accepted, drafted = _counts(spec, "per_step_accepted"), _counts(spec, "per_step_drafted")
    if len(accepted) != len(drafted) or len(accepted) != spec["num_spec_steps"]:
        raise ServerError(f"the server's per-step arrays disagree: {len(accepted)} accepted and {len(drafted)} drafted "
                          f"entries for {spec['num_spec_steps']} speculative steps")
    if any(a > d or d > spec["num_spec_tokens"] for a, d in zip(accepted, drafted)):
        raise ServerError(f"the server's per-step arrays are impossible: a step accepts more than it drafted, or drafts more "
                          f"than num_spec_tokens ({spec['num_spec_tokens']})")
    if sum(accepted) != spec["num_accepted_draft_tokens"] or sum(drafted) != spec["num_draft_tokens"]:
        raise ServerError("the server's per-step arrays do not add up to its totals (num_accepted_draft_tokens, "
                          "num_draft_tokens)")
    return {**spec, "per_step_accepted": accepted, "per_step_drafted": drafted}


def read_answer(answer: dict, drafter: str = "server", wall_ms: float = 0.0, speculative_config: dict | None = None) -> ServerAnswer:
    """A chat completion's body (``return_token_ids``, n = 1) as a :class:`ServerAnswer`; a one-line ServerError
    naming the first thing that is not as vLLM sends it. ``wall_ms``: the request's time as the client saw it, the
    run's end where the server does not report its own times (``--enable-per-request-metrics``).
    ``speculative_config``: the server's, where known (an n-gram server's steps are placed by its rule)."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ServerError("the server's answer has no choices: is this an OpenAI chat completion?")
    if len(choices) != 1:
        raise ServerError(f"the server answered with {len(choices)} choices: per-request speculation is reported for n = 1 only")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ServerError("the server's choice is not a JSON object")
    token_ids = _ids(choice.get("token_ids"), "answer token_ids")
    prompt_ids = _ids(answer.get("prompt_token_ids"), "prompt_token_ids")
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    text = message.get("content") or ""
    if not isinstance(text, str):
        raise ServerError("the server's message content is not text")
    metrics = answer.get("metrics")
    spec = read_spec(metrics)
    timing = {k: float(v) for k, v in metrics.items() if k in TIMING_KEYS and isinstance(v, int | float) and v >= 0}
    timing["client_wall_ms"] = wall_ms
    finish = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
    out = ServerAnswer(prompt_ids, token_ids, text, finish, spec, timing)
    out.steps = split_steps(prompt_ids, token_ids, spec["per_step_accepted"], spec["per_step_drafted"], timing, drafter,
                            ngram_rule(speculative_config), spec["num_spec_tokens"])
    return out


def ngram_rule(config: dict | None) -> tuple[int, int, int] | None:
    """(shortest, longest, k) of a server's n-gram speculative config, with vLLM's defaults; None for another method."""
    if not isinstance(config, dict) or config.get("method") != "ngram":
        return None
    low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
    low, high = (low or high or 5), (high or low or 5)
    k = config.get("num_speculative_tokens")
    if not all(isinstance(v, int) and v >= 1 for v in (low, high, k)) or low > high:
        raise ServerError(f"the n-gram speculative config {config} needs prompt_lookup_min <= prompt_lookup_max and "
                          "num_speculative_tokens, all positive")
    return low, high, k


def _step(step: int, drafter: str, gamma: int, drafts: list, accepted: int, emitted: list[int], elapsed_ms: float,
          untold: list[str]) -> StepEvent:
    return StepEvent(step=step, drafter=drafter if drafts else "target", gamma=gamma if drafts else 0, drafted=len(drafts),
                     draft_ids=drafts, draft_q=[], draft_p=[], accepted=accepted, emitted_ids=emitted, emitted_p=[],
                     accept_reasons=["exact"] * accepted, spans=dict.fromkeys(SPANS, 0.0), total_ms=0.0, forward_ms=0.0,
                     elapsed_ms=elapsed_ms, tree=TreeRecord.single_path(len(drafts), accepted), untold=untold)


def split_steps(prompt_ids: list[int], token_ids: list[int], accepted: list[int], drafted: list[int], timing: dict,
                drafter: str = "server", ngram: tuple[int, int, int] | None = None, gamma: int = 0) -> list[StepEvent]:
    """The prefill's target step, then one step per array entry; refused unless the arrays account for every token.

    vLLM lists no step that drafted nothing. With an n-gram server's rule (``ngram``: shortest, longest, k) its
    proposals are replayed on the tokens: a position without a match is a plain target step, and every other step's
    drafts (rejected ones included) must have the length the server lists and agree with the tokens it kept. ``gamma``:
    the server's γ budget (``num_spec_tokens``; by default the most any step drafted)."""
    if not token_ids:
        return []
    gamma = gamma or max(drafted, default=0)
    ttft = timing.get("time_to_first_token_ms", 0.0)
    end = ttft + timing["generation_time_ms"] if "generation_time_ms" in timing else timing.get("client_wall_ms", 0.0)
    steps = [_step(1, drafter, 0, [], 0, token_ids[:1], ttft, ["p", "times"])]
    at, i = 1, 0
    while at < len(token_ids):
        proposal = None if ngram is None else ngram_proposal(prompt_ids + token_ids[:at], *ngram)
        if proposal == []:
            steps.append(_step(len(steps) + 1, drafter, 0, [], 0, token_ids[at:at + 1], end, ["p", "times"]))
            at += 1
            continue
        if i == len(accepted):
            hint = ("" if ngram else "; vLLM lists no step that drafted nothing: for an n-gram server, give its "
                    "speculative config and specviz replays the rule")
            raise ServerError(f"the server's per-step arrays ({len(accepted)} steps) account for {at} of the {len(token_ids)} "
                              f"tokens it emitted: the steps cannot be drawn{hint}")
        a, d = accepted[i], drafted[i]
        emitted = token_ids[at:at + a + 1]
        kept = emitted[:a]
        if proposal is not None and (len(proposal) != d or proposal[:len(kept)] != kept):
            raise ServerError(f"the n-gram rule {ngram} does not reproduce the server's step {i + 1} ({a} of {d} drafts kept): "
                              "is that the server's speculative config?")
        drafts = kept + [None] * (d - len(kept)) if proposal is None else proposal
        told = list(UNTOLD) if proposal is None else ["p", "q", "times"]
        steps.append(_step(len(steps) + 1, drafter, gamma, drafts, min(a, len(emitted)), emitted, end, told))
        at += len(emitted)
        i += 1
    if i < len(accepted):
        raise ServerError(f"the server's per-step arrays list {len(accepted)} steps, but its {len(token_ids)} tokens end "
                          f"after {i}: the steps cannot be drawn")
    return steps
