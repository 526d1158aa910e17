"""The provenance names the toolchains that built an artifact in its resolvedDependencies: llama.cpp's pinned commit
with the sha256 of the source archive its tree is built from, other tools by their pinned version, and no digest
that is not known (real git + DVC repositories, real keys)."""

from __future__ import annotations

import json

from registry_env import Repo
from test_provenance_bound import signed  # noqa: F401  (the fixture)

from pipelines.core.toolchains import read_pins
from pipelines.registry.register import artifact_dir
from pipelines.trust import provenance


def test_a_signed_provenance_names_llama_cpp_with_its_commit_and_source_sha256(signed: Repo) -> None:  # noqa: F811
    stmt = json.loads((artifact_dir(signed.settings(), "tiny-qwen2", "q4_k_m") / provenance.PROVENANCE).read_text())
    deps = {d["name"]: d for d in stmt["predicate"]["buildDefinition"]["resolvedDependencies"]}
    pins = read_pins("llama-cpp")
    llama = deps["toolchain:llama.cpp"]
    assert llama["annotations"]["llama.cpp.commit"] == pins["LLAMA_CPP_COMMIT"]
    assert llama["uri"] == f"pkg:pypi/llama-cpp-python@{pins['LCPP_PY_VERSION']}"
    assert llama["digest"] == {"sha256": pins["LCPP_SDIST_SHA256"]}
    # and the signature covers it: the statement still verifies as registered
    assert stmt["predicate"]["buildDefinition"]["internalParameters"]["toolchain"]["llama.cpp"] == "0c1e570"


def test_a_tool_installed_by_version_alone_gets_no_made_up_digest() -> None:
    deps = provenance.toolchain_dependencies(
        {"llmcompressor": "0.14.0.1", "torch": "2.13.0", "transformers": "5.17.0", "compressed-tensors": "0.19.0"}
    )
    assert [d["uri"] for d in deps] == [
        "pkg:pypi/compressed-tensors@0.19.0", "pkg:pypi/llmcompressor@0.14.0.1", "pkg:pypi/torch@2.13.0",
        "pkg:pypi/transformers@5.17.0",
    ]
    assert all("digest" not in d and "no digest recorded" in d["annotations"]["source"] for d in deps)
    # a llama.cpp commit the checkout's pins do not name: its commit, no digest
    (other,) = provenance.toolchain_dependencies({"llama.cpp": "fffffff"})
    assert "digest" not in other and other["annotations"]["llama.cpp.commit"] == "fffffff"
