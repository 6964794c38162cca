"""The model runs behind the judge datasets: greedy continuations in left-padded batches, teacher-forced argmax tokens,
the offline target's greedy answers and the bundled draft's proposals along an answer. torch and the models load
inside the functions; :mod:`specviz.training.judge_data` keeps the caches of these runs."""

from __future__ import annotations

from specviz.models.paths import ASSETS

DRAFT_MODEL = ASSETS / "models" / "smollm2-draft-s"


# ----------------------------------------------------------------------------- the target's own answers


def _left_padded(rows: list[list[int]], pad: int):
    import torch

    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def greedy_finish(model, rows: list[list[int]], budgets: list[int], pad: int, stops: set[int], batch: int = 32) -> list[list[int]]:
    """Greedy continuations of the id lists ``rows`` (left-padded batches of similar budgets), each cut at its
    budget and before its first stop id (so a row shorter than its budget stopped)."""
    import torch

    out: list[list[int]] = [[] for _ in rows]
    order = [i for i in sorted(range(len(rows)), key=lambda i: budgets[i]) if budgets[i] > 0]
    for start in range(0, len(order), batch):
        todo = order[start:start + batch]
        ids, mask = _left_padded([rows[i] for i in todo], pad)
        with torch.inference_mode():
            seqs = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=pad,
                                  max_new_tokens=max(budgets[i] for i in todo))[:, ids.shape[1]:].tolist()
        for i, row in zip(todo, seqs):
            row = row[:budgets[i]]
            out[i] = row[:next((k for k, t in enumerate(row) if t in stops), len(row))]
    return out


def teacher_forced_argmax(model, prompt: list[int], answer: list[int]) -> list[int]:
    """``model``'s greedy token for every position of ``answer``, teacher-forced on ``prompt + answer``."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + answer], device=model.device)).logits[0, len(prompt) - 1: -1]
    return logits.argmax(-1).tolist()


def generate_target(texts: list[str], batch: int = 32, max_new_tokens: int = 48) -> list[dict]:
    """The offline target's greedy answers ({question, answer, finished}) through its chat template, in left-padded batches."""
    import torch

    from specviz.models.presets import OFFLINE_PRESET, resolve_preset
    from specviz.models.prompts import encode_prompt, stop_ids_of
    from specviz.runtime.bank import ModelBank

    torch.set_num_threads(1)
    bank, preset = ModelBank(), resolve_preset(OFFLINE_PRESET)
    tok, lm = bank.tokenizer(preset.target), bank.target(preset)
    prompts = [encode_prompt(tok, t, chat=True) for t in texts]
    rows = greedy_finish(lm.model, prompts, [max_new_tokens] * len(texts), tok.pad_token_id, set(stop_ids_of(lm, tok)), batch)
    return [{"question": text, "answer": tok.decode(row, skip_special_tokens=True), "finished": len(row) < max_new_tokens}
            for text, row in zip(texts, rows)]


# ----------------------------------------------------------------------------- the draft's proposals


def draft_proposals_of(pairs: list[tuple[str, str]]) -> list[dict]:
    """For each (question, correct answer): the bundled draft's greedy token after every prefix of the answer
    that ends at a token boundary of the target's tokenization (chat template, teacher-forced, float32).

    Row: ``{question, answer, cuts}``, ``cuts`` a list of ``[offset, next_id, draft_id, draft_piece, fits]``:
    the prefix ``answer[:offset]`` re-tokenizes to the answer's first tokens, ``next_id`` is the answer's
    token there, ``draft_id`` / ``draft_piece`` the draft's argmax (specials decoded as their text) and
    ``fits`` whether ``prefix + draft_piece`` re-tokenizes to those tokens + ``draft_id``."""
    import torch
    from transformers import AutoModelForCausalLM

    from specviz.models.presets import OFFLINE_PRESET, resolve_preset
    from specviz.models.prompts import encode_prompt
    from specviz.runtime.bank import ModelBank

    torch.set_num_threads(1)
    tok = ModelBank().tokenizer(resolve_preset(OFFLINE_PRESET).target)
    draft = AutoModelForCausalLM.from_pretrained(str(DRAFT_MODEL), dtype=torch.float32).eval()
    out = []
    for question, answer in pairs:
        prompt = encode_prompt(tok, question, chat=True)
        enc = tok(answer, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc.input_ids)
        cuts = []
        for k, ((start, _), true, d) in enumerate(zip(enc.offset_mapping, ids, teacher_forced_argmax(draft, prompt, ids))):
            prefix = answer[:start]
            if tok(prefix, add_special_tokens=False).input_ids != ids[:k]:
                continue  # not a clean cut (inside a multi-byte character, or the prefix re-tokenizes differently)
            piece = tok.decode([d])
            cuts.append([start, true, d, piece, tok(prefix + piece, add_special_tokens=False).input_ids == ids[:k] + [d]])
        out.append({"question": question, "answer": answer, "cuts": cuts})
    return out
