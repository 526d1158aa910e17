"""Reproduced-by attestations: a second builder rebuilt an artifact from its provenance and got the same bytes.

An attestation is a DSSE envelope (in-toto's, through securesystemslib) holding an in-toto statement whose subjects
are the registered files (all but the signature and the provenance) and whose predicate names the artifact, the
provenance it was rebuilt from (by sha256), when, and the rebuild itself: the tools that ran (each with its run
count), on which builder and machine, from when to when. `rebuild_and_attest` rebuilds from nothing: an empty work
directory and a hash cache of its own, from a provenance whose signature was checked first. It is signed with the reproducing builder's key and kept in git
beside the manifest, registry/attestations/NAME/TAG/reproduced-<keyid16>.json: adding one changes nothing of the
artifact, its DVC record or its first signature.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import platform
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipelines import __version__
from pipelines.core.errors import RegistryError, SignatureRefused
from pipelines.core.fsutil import HashCache, hash_cache, write_text_atomic
from pipelines.core.settings import Settings
from pipelines.store.manifest import Manifest
from pipelines.trust import provenance
from pipelines.trust.policy import TrustPolicy
from pipelines.trust.signing import REPRODUCED_PREDICATE, SIGNATURE, SigningKey, reproduction_signer

if TYPE_CHECKING:
    from pipelines.registry.register import Candidate

PREDICATE_TYPE: Final = REPRODUCED_PREDICATE
PAYLOAD_TYPE: Final = "application/vnd.in-toto+json"
NOT_COMPARED: Final = (SIGNATURE, provenance.PROVENANCE)
"""What a rebuild does not reproduce byte for byte: the signature (ECDSA signatures differ on every signing) and the
provenance (its signing time)."""


class ReproductionDiffers(RegistryError):
    """A rebuild whose files are not the registered bytes: no attestation is written."""

    def __init__(self, ref: str, file: str, detail: str) -> None:
        super().__init__(
            f"{ref}: the rebuild differs from the registered artifact, first at {file} ({detail}); no attestation "
            "was written",
            hint="compare the toolchain pins and the source commit with `modelmint show NAME:TAG --provenance`; "
            "the rebuild is kept under MODELMINT_WORK_DIR/reproduce/ for a look",
        )
        self.ref = ref
        self.file = file


@dataclass(frozen=True)
class Attestation:
    path: Path
    keyid: str
    reproduced_on: datetime
    signer: str | None
    """The trust policy's name of the key that signed it (None: a key the policy does not name)."""
    matches: bool
    """Whether its subjects are the manifest's files (an attestation of an earlier registration does not)."""


def attestations_dir(settings: Settings, name: str, tag: str) -> Path:
    return settings.repo_dir / "registry" / "attestations" / name / tag


def compare(manifest: Manifest, rebuilt: Path, hashes: HashCache) -> None:
    """Check that `rebuilt` (an artifact directory placed from a rebuild) holds the registered files' bytes.

    Raises:
        ReproductionDiffers: naming the first file (in path order) that differs, is missing or is extra.
    """
    expected = {f.path: f.sha256 for f in manifest.files if f.path not in NOT_COMPARED}
    here = {
        p.relative_to(rebuilt).as_posix(): p
        for p in rebuilt.rglob("*")
        if p.is_file() and p.relative_to(rebuilt).as_posix() not in NOT_COMPARED
    }
    for rel in sorted(set(expected) | set(here)):
        if rel not in here:
            raise ReproductionDiffers(manifest.ref, rel, "the rebuild has no such file")
        if rel not in expected:
            raise ReproductionDiffers(manifest.ref, rel, "the registered artifact has no such file")
        actual = hashes.sha256(here[rel])
        if actual != expected[rel]:
            raise ReproductionDiffers(manifest.ref, rel, f"sha256 {actual}, registered {expected[rel]}")


@dataclass(frozen=True)
class Rebuild:
    """What a rebuild ran: each tool (its program's name) with how many times it ran, on which machine, when."""

    tools: dict[str, int]
    machine: dict[str, str]
    started: datetime
    finished: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "tools": [{"name": n, "runs": c} for n, c in sorted(self.tools.items())],
            "machine": self.machine,
            "startedOn": _stamp(self.started),
            "finishedOn": _stamp(self.finished),
            "seconds": round((self.finished - self.started).total_seconds(), 1),
        }


def _stamp(when: datetime) -> str:
    return provenance.statement_time(when.replace(microsecond=0))


def attest(
    settings: Settings, manifest: Manifest, rebuilt: Path, key: SigningKey, *, now: datetime | None = None,
    rebuild: Rebuild | None = None,
) -> Path:
    """Compare `rebuilt` with the registered artifact and, when every byte matches, write the attestation signed
    with `key` (a rerun with the same key replaces its own attestation). `rebuild` (what ran) goes in it; without
    one the attestation says `rebuild: null`: the bytes were compared, nothing says how they were made.

    Raises:
        ReproductionDiffers: a file differs (nothing written).
        SigningKeyError: the key cannot sign.
    """
    from cryptography.hazmat.primitives import serialization
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner

    compare(manifest, rebuilt, hash_cache(settings))
    private = serialization.load_pem_private_key(key.key.read_bytes(), password=None)
    signer = CryptoSigner(private)
    prov = next((f.sha256 for f in manifest.files if f.path == provenance.PROVENANCE), None)
    when = (now or datetime.now(UTC)).replace(microsecond=0)
    stmt = {
        "_type": provenance.STATEMENT_TYPE,
        "subject": [
            {"name": f.path, "digest": {"sha256": f.sha256}}
            for f in sorted(manifest.files, key=lambda f: f.path)
            if f.path not in NOT_COMPARED
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "artifact": manifest.ref,
            "key": manifest.key,
            "provenance": {"sha256": prov} if prov else None,
            "reproducedBy": {
                "keyid": signer.public_key.keyid,
                "builder": provenance.builder_id(key),
                "modelmint": __version__,
                "modelmint.commit": provenance.modelmint_commit(),
            },
            "reproducedOn": provenance.statement_time(when),
            "rebuild": rebuild.to_json() if rebuild is not None else None,
        },
    }
    envelope = Envelope(
        payload=json.dumps(stmt, sort_keys=True).encode(), payload_type=PAYLOAD_TYPE, signatures={}
    )
    envelope.sign(signer)
    path = (
        attestations_dir(settings, manifest.name, manifest.tag)
        / f"reproduced-{signer.public_key.keyid[:16]}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(envelope.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def attestations(settings: Settings, manifest: Manifest, policy: TrustPolicy | None) -> list[Attestation]:
    """The reproduced-by attestations of `manifest`, each checked: its DSSE signature by a key of the trust
    policy's rule for the model (else `signer` None), and whether its subjects are the manifest's files.

    Raises:
        SignatureRefused: an attestation file that is not a DSSE envelope of a reproduced-by statement.
    """
    out = []
    for path in sorted(attestations_dir(settings, manifest.name, manifest.tag).glob("reproduced-*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            stmt = json.loads(base64.b64decode(data["payload"]))
            keyid = str(stmt["predicate"]["reproducedBy"]["keyid"])
            when = provenance.read_time(stmt["predicate"]["reproducedOn"])
            subjects = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
        except (ValueError, KeyError, TypeError) as err:
            raise SignatureRefused(
                manifest.ref, f"{path} is not a reproduced-by attestation ({err})", file=str(path)
            ) from None
        expected = {f.path: f.sha256 for f in manifest.files if f.path not in NOT_COMPARED}
        matches = subjects == expected and stmt.get("predicateType") == PREDICATE_TYPE
        out.append(Attestation(path, keyid, when, _signer_of(data, manifest, policy), matches))
    return out


def _signer_of(data: dict[str, Any], manifest: Manifest, policy: TrustPolicy | None) -> str | None:
    """The policy's name of the key whose signature on the envelope verifies (public keys only)."""
    rule = policy.rule_for(manifest.name) if policy is not None else None
    if rule is None:
        return None
    by = reproduction_signer(data, rule.signers)
    return by.name if by is not None else None


def rebuild_and_attest(
    settings: Settings, ref: str, key: SigningKey, *, progress: Callable[[str], None] = lambda _m: None
) -> Path:
    """Rebuild registered `ref` from nothing and attest it when every byte matches.

    The provenance is checked first (its signature, by a key the trust policy accepts, and its agreement with the
    manifest: signing.verify_directory); the catalog entry it records is then built at the source commit the
    manifest names, in a new empty work directory with a hash cache of its own (MODELMINT_WORK_DIR/reproduce/
    runs/<time>-<pid>; nothing a build of this checkout left is reused), placed as registration would under
    MODELMINT_WORK_DIR/reproduce/artifacts/NAME/TAG (kept there for a look), and compared. The attestation records
    the tools that ran, the builder and the machine, and for how long.

    Raises:
        NotRegistered, ManifestInvalid: no usable manifest.
        TrustPolicyInvalid: the trust policy does not validate.
        SignatureRefused: the provenance's signature or its agreement with the manifest is refused (nothing built).
        RegistryError: no trust policy to check the provenance with, no provenance to rebuild from (an unsigned
            artifact), the rebuild failed its gate, or it ran no tool.
        ReproductionDiffers: the rebuild's bytes differ (naming the first file); no attestation is written.
        everything the format's build raises.
    """
    import shutil

    from pipelines.source.catalog import CatalogEntry
    from pipelines.store.formats import format_of
    from pipelines.store.manifest import find_manifest

    manifest = find_manifest(settings, ref)
    stmt = verified_provenance(settings, manifest)
    entry = CatalogEntry.model_validate(
        stmt["predicate"]["buildDefinition"]["externalParameters"]["catalog_entry"]
    )
    fmt = format_of(manifest.tag)
    run = settings.work_dir / "reproduce" / "runs" / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{os.getpid()}"
    fresh = _fresh(settings, run)
    started = datetime.now(UTC)
    with _tools_run() as tools:
        begun = time.monotonic()
        result = fmt.build_here(
            entry, fresh, variants=[manifest.tag], revision=manifest.source.revision, progress=progress
        )
        seconds = time.monotonic() - begun
    if manifest.tag not in result.passed or result.plan is None:
        raise RegistryError(
            f"{manifest.ref}: the rebuild did not pass its gate here, so it reproduces nothing",
            hint=f"see the build's report under {fresh.work_dir}",
        )
    if not tools:
        raise RegistryError(
            f"{manifest.ref}: the rebuild in {fresh.work_dir} ran no tool, so it reproduces nothing",
            hint="this is a bug in modelmint: a rebuild in an empty work directory must run the build's tools",
        )
    c = fmt.candidate(result.plan, result.variants[manifest.tag])
    into = settings.work_dir / "reproduce"
    shutil.rmtree(into / manifest.dvc.path, ignore_errors=True)  # an earlier reproduction's placement
    rebuild = Rebuild(dict(tools), _machine(), started, started + timedelta(seconds=seconds))
    return attest(settings, manifest, place_rebuild(fresh, c, into), key, rebuild=rebuild)


def verified_provenance(settings: Settings, manifest: Manifest) -> dict[str, Any]:
    """The provenance of registered `manifest` once its signature and its agreement with the manifest are checked
    under the trust policy (the checkout's copy, else the DVC remote's; the artifact's other files are not needed).

    Raises:
        TrustPolicyInvalid: the trust policy does not validate.
        RegistryError: there is no trust policy, or no provenance (registered unsigned).
        SignatureRefused: as signing.verify_directory.
        RemoteError, RemoteUnavailable: the checkout lacks it and the remote cannot be read.
    """
    import tempfile

    from pipelines.trust import signing
    from pipelines.trust.policy import load_policy

    policy = load_policy(settings)
    if policy is None:
        raise RegistryError(
            f"{manifest.ref}: there is no trust policy to check its provenance's signature with, so what it records "
            "cannot be rebuilt from",
            hint="add registry/trust.yaml naming the keys that sign (docs/trust.md), then rerun",
        )
    if not any(f.path == provenance.PROVENANCE for f in manifest.files):
        raise RegistryError(
            f"{manifest.ref} has no provenance to rebuild from (it was registered unsigned)",
            hint="register it again with MODELMINT_SIGNING_KEY set",
        )
    wanted = [SIGNATURE, provenance.PROVENANCE]
    placed = settings.repo_dir / manifest.dvc.path
    if all((placed / f).is_file() for f in wanted):
        held = {f: (placed / f).read_bytes() for f in wanted}
    else:
        from pipelines.store.dvcrepo import read_remote_files

        held = read_remote_files(settings, manifest.dvc.md5, wanted) if manifest.dvc.md5 else {}
    shown = f"registry/manifests/{manifest.name}/{manifest.tag}.json"
    with tempfile.TemporaryDirectory(prefix="modelmint-reproduce-") as scratch:
        for rel, data in held.items():
            (Path(scratch) / rel).write_bytes(data)
        verified = signing.verify_directory(
            Path(scratch), manifest, policy, shown=shown, files_here=False, reproductions=False
        )
    if verified.statement is None:
        raise RegistryError(
            f"{manifest.ref} has no signed provenance to rebuild from",
            hint="register it again with MODELMINT_SIGNING_KEY set",
        )
    return verified.statement


def _fresh(settings: Settings, run: Path) -> Settings:
    """`settings` with an empty work directory `run`/work and a home of its own, `run`/home, whose entries link to the
    real home's (toolchains, source models, download caches) but for the hash cache: nothing a build here left is
    reused, and no file's hash is taken from an earlier run."""
    from dataclasses import replace

    home = run / "home"
    home.mkdir(parents=True)
    (run / "work").mkdir()
    if settings.home.is_dir():
        for entry in settings.home.iterdir():
            if not entry.name.startswith("hashcache"):
                (home / entry.name).symlink_to(entry.resolve())
    return replace(settings, work_dir=run / "work", home=home)


@contextmanager
def _tools_run() -> Iterator[Counter[str]]:
    """Count the tools the runner starts meanwhile (pipelines.core.runner logs each argv at DEBUG before it runs it);
    what the runner logs is shown as before (the DEBUG records let through for counting stop here)."""
    from pipelines.core import runner

    seen: Counter[str] = Counter()
    logger = runner.log
    level, shown_from = logger.level, logger.getEffectiveLevel()

    def count(record: logging.LogRecord) -> bool:
        if record.msg == "running %s" and isinstance(record.args, tuple) and record.args:
            argv = record.args[0]
            if isinstance(argv, list) and argv:
                seen[_tool([str(a) for a in argv])] += 1
        return record.levelno >= shown_from

    logger.addFilter(count)
    logger.setLevel(logging.DEBUG)
    try:
        yield seen
    finally:
        logger.removeFilter(count)
        logger.setLevel(level)


def _tool(argv: list[str]) -> str:
    """A tool's name: its program, or the script a Python runs (`python convert_hf_to_gguf.py` → the script)."""
    name = Path(argv[0]).name
    if name.startswith("python") and len(argv) > 1:
        script = next((a for a in argv[1:] if not a.startswith("-")), None)
        if argv[1] == "-m" and len(argv) > 2:
            return f"{name} -m {argv[2]}"
        if script is not None:
            return Path(script).name
    return name


def _machine() -> dict[str, str]:
    """The machine a rebuild ran on, as far as it shapes the bytes: its host name, OS, CPU architecture and count."""
    return {
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "cpus": str(os.cpu_count() or 0),
    }


def place_rebuild(settings: Settings, c: Candidate, into: Path) -> Path:
    """Place rebuilt candidate `c` as registration would (its files, Modelfile or vllm.yaml, card, serving plans) under
    `into` instead of the repository, unsigned and unrecorded: what `compare` reads."""
    from dataclasses import replace

    from pipelines.registry.register import artifact_dir, place

    scratch = replace(settings, repo_dir=into, signing_key=None, signing_cert=None)
    place(scratch, c)
    return artifact_dir(scratch, c.entry.name, c.tag)
