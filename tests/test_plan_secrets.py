"""A run's credentials reach its steps but never what a cache stores: the fetch step's result (the plan, which the
flow's Prefect cache persists) holds no token, and the steps that plan lays out run with the run's token again (a
gated calibration dataset is downloaded with it by llmcompressor's step)."""

from __future__ import annotations

import pickle

from registry_env import Repo

from pipelines.core.steps import RECORD, Executed
from pipelines.source.catalog import load_catalog
from pipelines.store.formats import implementation

TOKEN = "hf_plan_secret_0123456789"


def test_the_fetched_plan_is_stored_without_the_token_and_its_steps_run_with_it(repo: Repo) -> None:
    settings = repo.settings(HF_TOKEN=TOKEN)
    assert settings.hf_token == TOKEN
    gguf = implementation("gguf")
    fetch = gguf.fetch_step(load_catalog(settings.catalog_path).get("tiny-qwen2"), settings, variants=["q8_0"])
    plan = fetch.run({})
    assert plan.settings.hf_token is None and TOKEN.encode() not in pickle.dumps(plan)
    assert fetch.then is not None
    listed = fetch.then(plan)
    finish = next(s for s in listed.steps if s.name == gguf.finish_step)
    result = finish.run({RECORD: Executed()})  # what the build's steps and its finish were given
    assert result.plan.settings.hf_token == TOKEN
