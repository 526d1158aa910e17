"""Each Settings field declares its role and its environment variables; the credential and orchestration lists are
read off those declarations, and from_env reads exactly the declared variables."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path
from typing import get_args

import pytest

import pipelines
from pipelines.core.settings import Role, Settings

# a value from_env accepts for each field's variables, and what the field then holds (as str)
_SAMPLES = {
    "home": ("/h", "/h"),
    "work_dir": ("/w", "/w"),
    "catalog_path": ("/c.yaml", "/c.yaml"),
    "hf_endpoint": ("http://hub", "http://hub"),
    "hf_token": ("t", "t"),
    "threads": ("3", "3"),
    "repo_dir": ("/r", "/r"),
    "prefect_home": ("/p", "/p"),
    "prefect_port": ("4300", "4300"),
    "gpu_slots": ("2", "2"),
    "prefect_crash_after_s": ("60", "60"),
    "webhook_secret": ("s", "s"),
    "package_index": ("http://index", "http://index"),
    "ray_address": ("head:6379", "head:6379"),
    "ray_resources": ("{}", "{}"),
    "registry_username": ("u", "u"),
    "registry_password": ("p", "p"),
    "docker_config": ("/d", "/d/config.json"),
    "registry_ca": ("/ca.pem", "/ca.pem"),
    "serve_gpus": ("1xL4-24G", "('1xL4-24G',)"),
    "oci_registry": ("host/ns", "host/ns"),
    "oci_insecure": ("1", "True"),
    "signing_key": ("/k.pem", "/k.pem"),
    "signing_cert": ("/chain.pem", "/chain.pem"),
    "skip_resource_check": ("1", "True"),
    "keep_scratch": ("1", "True"),
    "trust_policy": ("/trust.yaml", "/trust.yaml"),
    "tsa_url": ("http://127.0.0.1:3180/tsr", "http://127.0.0.1:3180/tsr"),
}


def test_every_field_declares_a_role_and_its_variables() -> None:
    assert {f.name for f in fields(Settings)} == set(_SAMPLES), "a new setting needs a sample value here"
    for f in fields(Settings):
        assert f.metadata["role"] in get_args(Role), f.name
        assert f.metadata["env"] and all(v.isupper() for v in f.metadata["env"]), f.name
        assert f.repr == (f.metadata["role"] != "secret"), (
            f"{f.name}: a secret never shows in repr, others do"
        )


@pytest.mark.parametrize("name", sorted(_SAMPLES))
def test_each_declared_variable_alone_sets_its_field(name: str) -> None:
    value, held = _SAMPLES[name]
    for var in Settings.env_of(name):
        assert str(getattr(Settings.from_env({var: value}), name)) == held, (name, var)


def test_the_lists_are_the_roles() -> None:
    secret = {f.name for f in fields(Settings) if f.metadata["role"] == "secret"}
    assert (
        set(Settings.SECRETS)
        == secret
        == {"hf_token", "webhook_secret", "registry_username", "registry_password"}
    )
    assert set(Settings.SECRET_ENV) == {
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "MODELMINT_WEBHOOK_SECRET",
        "MODELMINT_REGISTRY_USERNAME",
        "MODELMINT_REGISTRY_PASSWORD",
    }
    assert set(Settings.ORCHESTRATION) == {
        f.name for f in fields(Settings) if f.metadata["role"] == "orchestration"
    }
    everything = Settings.from_env({var: v for n, (v, _) in _SAMPLES.items() for var in Settings.env_of(n)})
    assert set(everything.plan_fields()) == set(Settings.with_role("plan"))
    assert all(getattr(everything.without_secrets(), n) is None for n in Settings.SECRETS)


def test_from_env_reads_only_declared_variables() -> None:
    """Every variable name from_env mentions is one a field declares (and the process-wide ones it leaves alone)."""
    tree = ast.parse((Path(pipelines.__file__).parent / "core" / "settings.py").read_text(encoding="utf-8"))
    method = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "from_env")
    named = {
        n.value
        for n in ast.walk(method)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isupper()
    }
    declared = {v for f in fields(Settings) for v in f.metadata["env"]}
    assert named <= declared, named - declared
