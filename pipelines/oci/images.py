"""Registered artifacts as OCI images in a team's registry: `modelmint publish` pushes one, `pull --from-registry`
fetches and verifies one without DVC.

A GGUF becomes an Ollama image (`ollama pull HOST/NAMESPACE/NAME:TAG`), a compressed-tensors checkpoint a CNCF
ModelPack artifact; the format table (store/formats/) says which. Every layer that carries a registered file has that
file's sha256 from the manifest as its digest, and the manifest itself travels as a layer, byte for byte. Blobs go
first (HEAD before each: the registry never receives one twice), then the manifest by its digest, then its signature
(referrers.py), tags last: `TAG-<source12>` (the upstream commit the artifact was built from, `pinned_tag`) and `TAG`;
a tag that points at the image already is not written again. A publish that stops before its tags (the registry, the
signing, the Time-Stamp Authority) moved none: they still name the previous, signed image.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from pipelines.core.errors import (
    ManifestInvalid,
    OciError,
    RegistryError,
    SignatureRefused,
    TagConflict,
    TimestampUnavailable,
)
from pipelines.core.fsutil import atomic_output, hash_cache, write_text_atomic
from pipelines.core.settings import Settings
from pipelines.oci.referrers import Attached, attach, provenance_statement
from pipelines.publish.oci import (
    MODELMINT_MANIFEST,
    Blob,
    Credentials,
    Image,
    OciClient,
    RegistryRef,
    check_ollama_name,
    credentials_for,
    is_carried_manifest,
    parse_image,
)
from pipelines.publish.ollama_image import CONFIG as OLLAMA_CONFIG
from pipelines.registry.pull import PullResult, holds
from pipelines.store.formats.base import format_of, implementation
from pipelines.store.manifest import Manifest, find_manifest, manifest_path
from pipelines.store.published import publications, publications_path, read_publications

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    """What `publish_image` did: the image, the tags it set, and which blobs went over the wire."""

    manifest: Manifest
    registry: RegistryRef
    images: list[str]
    """HOST/NAMESPACE/NAME:TAG-<source12>, then HOST/NAMESPACE/NAME:TAG."""
    digest: str
    uploaded: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    """Blobs the repository held already (HEAD answered 200): not sent."""
    mounted: list[str] = field(default_factory=list)
    """Blobs the registry linked from another repository it holds them in (cross-repository mount): not sent."""
    retagged: dict[str, str] = field(default_factory=dict)
    """Tag → the manifest digest it pointed at before (an earlier registration of the artifact, or --force)."""
    tagged: list[str] = field(default_factory=list)
    """The tags this publish wrote; the others pointed at the image already (a rerun with nothing new writes none)."""
    referrers: Attached | None = None
    """The image's cosign signature and in-toto attestation (referrers.attach), when a signing key is configured."""

    @property
    def repository(self) -> str:
        return self.registry.repository(self.manifest.name)

    @property
    def tags(self) -> list[str]:
        return [image.rpartition(":")[2] for image in self.images]


def client_for(settings: Settings, registry: RegistryRef) -> OciClient:
    """A client with the credentials the environment or the docker config holds for the registry's host (looked up
    only when the registry asks for them: a broken docker config does not stop an anonymous push)."""

    def creds() -> Credentials | None:
        return credentials_for(registry.host, username=settings.registry_username,
                               password=settings.registry_password, docker_config=settings.docker_config)

    return OciClient(registry, credentials=creds, ca=settings.registry_ca)


def build_image(settings: Settings, ref: str) -> tuple[Manifest, Image]:
    """The image of registered artifact `ref`, from its directory in the checkout (every file checked first).

    Raises:
        NotRegistered: never registered (a variant that failed its gate never is).
        ManifestInvalid: its manifest does not say it passed validation, or does not check out.
        RegistryError: its files are not in the checkout, or hold other bytes than registered.
    """
    manifest = find_manifest(settings, ref)
    path = manifest_path(settings, manifest.name, manifest.tag)
    if not manifest.validation.passed:  # the schema admits only passed ones; a second look costs nothing
        raise ManifestInvalid(str(path), "its validation did not pass: it is never published")
    directory = settings.repo_dir / manifest.dvc.path
    if not holds(directory, manifest, hash_cache(settings)):
        raise RegistryError(f"{directory} does not hold {manifest.ref} as registered (missing or changed files)",
                            hint=f"place the registered files first: `modelmint pull {manifest.ref}`, then publish")
    extra = (Blob.of_bytes(MODELMINT_MANIFEST, path.read_bytes()),)
    return manifest, format_of(manifest.tag).image(directory, manifest, extra)


def pinned_tag(manifest: Manifest) -> str:
    """TAG-<source12>: the tag with the first 12 hex of the upstream commit the artifact was built from (what a user
    finds on the hub), or of the source's content hash for a source without one (generated, a local directory, a
    wheel). It comes from the manifest alone, so a flow run that commits nothing tags as a checkout does."""
    source = manifest.source
    return f"{manifest.tag}-{(source.revision or source.content_sha256)[:12]}"


def publish_command(ref: str, registry: RegistryRef, *, force: bool = False) -> str:
    """The command that publishes `ref` to `registry` (what an error tells people to run next)."""
    flags = (" --insecure" if registry.insecure else "") + (" --force" if force else "")
    return f"modelmint publish {ref} --registry {registry.host}/{registry.namespace}{flags}"


def publish_image(settings: Settings, ref: str, registry: RegistryRef, *, force: bool = False,
                  require_signature: bool = False) -> Published:
    """Push registered artifact `ref` to `registry` as its format's image and tag it TAG-<source12> and TAG.

    Every blob is HEAD-checked first (none is sent twice) and a tag already pointing at the image is not written
    again, so publishing again with nothing new uploads nothing and writes no tag. A tag that points at an earlier
    registration of the same name:tag moves to this one (the earlier image stays pullable by its digest, which the
    publication record keeps); a tag that points at anything else is refused unless `force`, and so is an image that
    carries this very registration but is not the image its signed files make (changed in the registry).

    The artifact is first verified as a pull would verify it (the trust policy, signing.verify_directory): what
    the policy refuses is never pushed. With a signing key configured (MODELMINT_SIGNING_KEY), the image's manifest,
    pushed by its digest and not tagged yet, is then signed where OCI tooling looks (oci/referrers.py): a cosign
    signature (`sha256-<hex>.sig`, with its RFC 3161 timestamp when MODELMINT_TSA_URL is set) and an in-toto
    attestation of its provenance (`sha256-<hex>.att`), both OCI 1.1 referrers of the image, listed under the
    referrers tag schema's `sha256-<hex>` index. Only then are the tags written: a puller that enforces signatures
    never finds a tag on an unsigned image, and a publish that fails before them leaves every tag where it was.

    Raises:
        everything build_image raises.
        TrustPolicyInvalid, SignatureRefused: the trust policy does not validate, or refuses the artifact (nothing
            uploaded or tagged).
        TagConflict: a tag points at another artifact's image, or at a newer registration (nothing uploaded or
            tagged; --force moves it).
        SigningKeyError: the configured signing key cannot sign (checked before anything is pushed).
        TimestampUnavailable: the Time-Stamp Authority gives no timestamp for the signature (the image is in the
            registry by its digest, unsigned and untagged; no tag moved); the hint names the command to run again.
        OciUnavailable, OciAuthRefused, OciError: the registry is down, refuses, or fails (blobs, manifest and
            signature before tags, so nothing is half-tagged); the hint ends with the command that publishes it again.
    """
    from pipelines.trust.policy import load_policy
    from pipelines.trust.signing import preflight, verify_directory

    manifest, image = build_image(settings, ref)
    key = preflight(settings)
    directory = settings.repo_dir / manifest.dvc.path
    shown = manifest_path(settings, manifest.name, manifest.tag).relative_to(settings.repo_dir).as_posix()
    try:
        verify_directory(directory, manifest, load_policy(settings), shown=shown, require_signature=require_signature)
    except SignatureRefused as err:  # worded for a pull: say what a publish did not do
        err.message = err.message.removesuffix("; nothing was pulled") + "; nothing was pushed"
        if "--allow-unsigned" in (err.hint or ""):
            err.hint = ("register it again with MODELMINT_SIGNING_KEY set: publish never pushes what the trust "
                        "policy refuses")
        raise
    tags = [pinned_tag(manifest), manifest.tag]
    for tag in tags:
        check_ollama_name(registry, manifest.name, tag)
    repository = registry.repository(manifest.name)
    moved: dict[str, list[str]] = {"uploaded": [], "mounted": [], "present": []}
    try:
        with client_for(settings, registry) as client:
            write, retagged = _tags_to_write(client, registry, manifest, image, tags, force=force,
                                             directory=directory, recorded=_recorded_digests(settings, manifest))
            mounts = mount_sources(settings, manifest, registry)
            for blob in image.blobs:
                moved[client.push_blob(repository, blob, mount_from=mounts)].append(blob.digest)
            if write and key is not None:
                # The manifest goes by its digest, no tag moved yet (distribution-spec, "Pushing Manifests":
                # https://github.com/opencontainers/distribution-spec/blob/main/spec.md#pushing-manifests, the
                # <reference> of PUT /v2/<name>/manifests/<reference> MAY be a digest): it is signed there, and the
                # tags are written only once its signature is pushed. Unsigned, the tags are the next PUT anyway.
                client.put_manifest(repository, image.digest, image)
            attached = None
            if key is not None:
                subject = {"mediaType": image.media_type, "digest": image.digest, "size": len(image.manifest_bytes())}
                try:
                    attached = attach(client, repository, f"{registry.host}/{repository}", subject, key,
                                      provenance_statement(directory),
                                      title=f"{manifest.name}-{manifest.tag}.intoto.jsonl")
                except (OciError, TimestampUnavailable) as err:
                    raise _untagged(err, registry, manifest, image.digest, write, retagged, force=force) from None
            for tag in write:
                client.put_manifest(repository, tag, image)
            if image.config.media_type == OLLAMA_CONFIG and not client.blob_redirects(repository, image.config.digest):
                # The push worked and modelmint's own pull works; only `ollama pull` would fail, at its first blob.
                log.warning("%s does not answer blob GETs with a 307 redirect to another host (with a Location): "
                            "`ollama pull %s` fails there (\"no Location header in response\", ollama/ollama#7244, "
                            "or \"unexpected status code\" for other redirects); serve the "
                            "registry's storage through redirects (distribution's `redirect` middleware on S3/GCS/"
                            "MinIO, or filesystem storage behind a file server), see docs/oci.md",
                            registry.host, registry.image(manifest.name, manifest.tag))
    except OciError as err:
        again = publish_command(manifest.ref, registry, force=isinstance(err, TagConflict))
        if again not in (err.hint or ""):
            err.hint = (f"{err.hint.rstrip('.')}; " if err.hint else "") + (
                f"{manifest.ref} stays registered: publish it with `{again}`")
        raise
    for tag, old in retagged.items():
        log.warning("moved %s from %s to %s", registry.image(manifest.name, tag), old, image.digest)
    done = Published(manifest, registry, [registry.image(manifest.name, t) for t in tags], image.digest,
                     moved["uploaded"], moved["present"], moved["mounted"], retagged, write, attached)
    record_publication(settings, done)
    return done


def _untagged(err: OciError | TimestampUnavailable, registry: RegistryRef, manifest: Manifest, digest: str,
              write: list[str], retagged: dict[str, str], *, force: bool) -> OciError | TimestampUnavailable:
    """`err` (the image's signature could not be made or pushed) worded for a publish that stopped before its
    tags: what each tag still names, and the command that publishes the image once the cause is fixed."""
    if write:
        still = "; ".join(f"{registry.image(manifest.name, t)} still names {retagged[t]}" if t in retagged else
                          f"{registry.image(manifest.name, t)} is not in the registry" for t in write)
        kept = f"{digest} is pushed by its digest but unsigned, and no tag was moved ({still})"
    else:
        kept = "its tags name the image already; its signature was not pushed"
    again = f"publish again with `{publish_command(manifest.ref, registry, force=force)}`"
    if isinstance(err, TimestampUnavailable):
        return err.left_as(kept, again)
    err.message += f": {kept}"
    hint = (err.hint or "").replace("then rerun the same command", f"then {again}")
    err.hint = hint if again in hint else (f"{hint.rstrip('.')}; " if hint else "") + f"then {again}"
    return err


def _tags_to_write(client: OciClient, registry: RegistryRef, manifest: Manifest, image: Image, tags: list[str], *,
                   force: bool, directory: Path, recorded: dict[tuple[str, str, str], set[str]],
                   ) -> tuple[list[str], dict[str, str]]:
    """The tags that do not point at `image` yet, and of those the ones that point elsewhere now (tag → digest).

    Raises:
        TagConflict: one points at an image that is not an earlier registration of this name:tag, or at an image
            that carries this registration but differs from the one its signed files in `directory` make (the
            difference named), or at an image of an earlier registration that the publication record says was
            pushed as another image (`recorded`: (host, repository, key) → the digests published), and not `force`.
    """
    repository = registry.repository(manifest.name)
    write: list[str] = []
    retagged: dict[str, str] = {}
    for tag in tags:
        there = client.get_manifest(repository, tag)
        if there is not None and there[2] == image.digest:
            continue
        if there is not None:
            carried = carried_manifest(client, repository, there)
            if not force and carried is not None and carried.key == manifest.key:
                raise TagConflict(registry.image(manifest.name, tag),
                                  f"{there[2]}, an image carrying {manifest.ref} that is not the one its signed "
                                  f"files make ({_difference(client, repository, there, directory, manifest)})",
                                  image.digest, registry=registry.host, hint=(
                                      "the image was changed in the registry after it was pushed: do not run it; "
                                      "find who can write to the registry, then move the tag back to the signed "
                                      f"image with --force (the changed image stays there by its digest, {there[2]})"))
            pushed = recorded.get((registry.host, repository, carried.key)) if carried is not None else None
            if not force and pushed and there[2] not in pushed:
                raise TagConflict(registry.image(manifest.name, tag),
                                  describe(there, carried) + f", which {manifest.ref}'s publication record says was "
                                  f"published as {', '.join(sorted(pushed))}: an image modelmint did not push",
                                  image.digest, registry=registry.host, hint=(
                                      "the image was changed in the registry after it was pushed: do not run it; "
                                      "find who can write to the registry, then move the tag with --force (the "
                                      f"changed image stays there by its digest, {there[2]})"))
            if not force and not _earlier(carried, manifest):
                newer = carried is not None and carried.ref == manifest.ref
                raise TagConflict(registry.image(manifest.name, tag), describe(there, carried), image.digest,
                                  registry=registry.host, hint=(
                                      "the registry holds a newer registration of this artifact: update this "
                                      "checkout (`git pull`) rather than move it back" if newer else
                                      "publish under another tag") + " or move the tag with --force (the image "
                                  f"there stays pullable by its digest, {there[2]})")
            retagged[tag] = there[2]
        write.append(tag)
    return write, retagged


def _recorded_digests(settings: Settings, manifest: Manifest) -> dict[tuple[str, str, str], set[str]]:
    """(registry host, repository, registration key) → the image digests the publication record of `manifest`'s
    name:tag says were pushed (every registration's entries, earlier ones included)."""
    found: dict[tuple[str, str, str], set[str]] = {}
    for e in read_publications(publications_path(settings, manifest.name, manifest.tag)):
        if all(isinstance(e.get(k), str) for k in ("registry", "repository", "key", "digest")):
            found.setdefault((e["registry"], e["repository"], e["key"]), set()).add(e["digest"])
    return found


def _difference(client: OciClient, repository: str, there: tuple[bytes, str, str], directory: Path,
                manifest: Manifest) -> str:
    """What makes the image `there` differ from the one `manifest`'s files in `directory` make (check_image's
    words)."""
    from pipelines.core.errors import SignatureRefused
    from pipelines.trust.signing import check_image

    try:
        check_image(json.loads(there[0]), directory, manifest, lambda d: client.read_blob(repository, d),
                    image=repository)
    except SignatureRefused as err:
        return err.problem
    return "its manifest is encoded differently"


def _earlier(there: Manifest | None, manifest: Manifest) -> bool:
    """Whether `there` (what a tag points at) is an earlier registration of the same name:tag, or this one."""
    return there is not None and there.ref == manifest.ref and there.created_at < manifest.created_at


def mount_sources(settings: Settings, manifest: Manifest, registry: RegistryRef) -> tuple[str, ...]:
    """Other repositories of the same registry this registration was published to: blobs mount from there."""
    here = registry.repository(manifest.name)
    found: list[str] = []
    for entry in publications(settings, manifest):
        if entry.get("registry") == registry.host and entry.get("repository") not in (here, None, *found):
            found.append(entry["repository"])
    return tuple(found)


def record_publication(settings: Settings, done: Published) -> Path:
    """Add where `done` pushed to the artifact's publication record, atomically; a publication recorded already
    leaves the file as it is. Entries are only ever added (or replaced by the same registration's to the same
    image): those of earlier registrations stay, naming the digests their images keep."""
    m = done.manifest
    path = publications_path(settings, m.name, m.tag)
    entry = {"image": done.images[-1], "registry": done.registry.host, "repository": done.repository,
             "tags": done.tags, "pinned": done.images[0], "digest": done.digest, "key": m.key, "sha256": m.sha256}
    entries = read_publications(path)
    same = [e for e in entries if e.get("image") == entry["image"] and e.get("key") == m.key]
    if same and all({k: e.get(k) for k in entry} == entry for e in same):
        return path
    entries = [e for e in entries if e not in same]
    entries.append({**entry, "published_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")})
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(sorted(entries, key=lambda e: (e["image"], e["published_at"])), indent=2) + "\n")
    return path


def carried_manifest(client: OciClient, repository: str, there: tuple[bytes, str, str]) -> Manifest | None:
    """The modelmint manifest an image in the registry carries as a layer, or None (not one modelmint pushed)."""
    try:
        layers = json.loads(there[0]).get("layers") or []
        layer = next(x for x in layers if is_carried_manifest(x))
        return Manifest.model_validate_json(client.read_blob(repository, layer["digest"]))
    except (ValueError, StopIteration, AttributeError, KeyError, RegistryError):
        return None


def describe(there: tuple[bytes, str, str], carried: Manifest | None) -> str:
    """What an existing manifest is: the modelmint artifact it carries (name:tag, main file sha256, date), or its
    digest alone."""
    digest = there[2]
    if carried is None:
        return f"{digest} (not an image modelmint published)"
    return (f"{digest} ({carried.ref}, {carried.file} sha256 {carried.sha256[:12]}…, registered "
            f"{carried.created_at:%Y-%m-%d %H:%M} UTC)")


# ---------------------------------------------------------------- pull


def pull_image(settings: Settings, image: str, *, insecure: bool = False, dest: Path | None = None,
               ollama: bool = True, allow_unsigned: bool = False, require_signature: bool = False) -> PullResult:
    """Fetch HOST/NAMESPACE/NAME:TAG into `dest` (default: its artifacts/ path), every blob hashed, every file
    checked against the manifest the image carries (and this checkout's, when it has one); no DVC involved.

    Raises:
        RegistryError: no such image, or not one modelmint published, or one that disagrees with its manifest.
        OciBlobMismatch: a blob's bytes are not its digest (nothing in `dest` is replaced).
        OciUnavailable, OciAuthRefused, OciError: the registry is down or refuses.
        TrustPolicyInvalid, SignatureRefused: the trust policy does not validate, or does not accept the artifact's
            signature (signing.verify_directory), or the image is not exactly the one its signed files make (a
            template, system, params or config layer changed in the registry: signing.check_image); nothing in
            `dest` is replaced.
    """
    from pipelines.trust.policy import load_policy
    from pipelines.trust.signing import check_image, verify_directory

    policy = load_policy(settings)
    registry, name, tag = parse_image(image, insecure=insecure)
    repository = registry.repository(name)
    with client_for(settings, registry) as client:
        got = client.get_manifest(repository, tag)
        if got is None:
            raise RegistryError(f"{image} is not in the registry",
                                hint=f"publish it: `modelmint publish NAME:TAG --registry {registry.host}/"
                                f"{registry.namespace}`")
        manifest = _read_image(client, repository, image, got)
        _is_what_was_asked(manifest, name, tag, image)
        _agrees_with_checkout(settings, manifest, image)
        target = dest if dest is not None else settings.repo_dir / manifest.dvc.path
        fetched = not holds(target, manifest, hash_cache(settings))
        shown = f"{image} (its manifest layer)"
        if fetched:
            with atomic_output(target) as tmp:
                tmp.mkdir()
                for f in manifest.files:
                    (tmp / f.path).parent.mkdir(parents=True, exist_ok=True)
                    client.fetch_blob(repository, "sha256:" + f.sha256, tmp / f.path)
                verified = verify_directory(tmp, manifest, policy, shown=shown, allow_unsigned=allow_unsigned,
                                            require_signature=require_signature)
                check_image(json.loads(got[0]), tmp, manifest, lambda d: client.read_blob(repository, d),
                            image=image)
        else:
            verified = verify_directory(target, manifest, policy, shown=shown, allow_unsigned=allow_unsigned,
                                        require_signature=require_signature)
            check_image(json.loads(got[0]), target, manifest, lambda d: client.read_blob(repository, d), image=image)
    return PullResult(manifest, target, fetched, **format_of(manifest.tag).offer(target, manifest, ollama),
                      verified=verified)


def _read_image(client: OciClient, repository: str, image: str,
                got: tuple[bytes, str, str]) -> Manifest:
    """The modelmint manifest an image carries, checked against the image's layout and layers."""
    data = json.loads(got[0])
    layers = data.get("layers") or []
    carried = [x for x in layers if is_carried_manifest(x)]
    if len(carried) != 1:
        raise RegistryError(f"{image} carries no modelmint manifest: it was not published by `modelmint publish`",
                            hint="pull it with the tool that pushed it (`ollama pull`, `oras pull`)")
    raw = client.read_blob(repository, carried[0]["digest"])
    try:
        manifest = Manifest.model_validate_json(raw)
    except ValidationError as err:
        raise ManifestInvalid(f"{image} (layer {carried[0]['digest']})", str(err).splitlines()[0]) from err
    want = implementation(manifest.format).image_config
    if (data.get("config") or {}).get("mediaType") != want:
        raise RegistryError(f"{image} holds {manifest.ref}, a {manifest.format} artifact, but its config is not {want}",
                            hint="the tag was pushed by something else: publish the artifact again with --force")
    sizes = {x.get("digest"): x.get("size") for x in layers}
    wrong = [f.path for f in manifest.files if sizes.get("sha256:" + f.sha256) != f.size]
    if wrong:
        raise RegistryError(f"{image}: the layers do not carry {', '.join(wrong)} as its manifest records them",
                            hint="publish the artifact again from the registering machine with --force")
    return manifest


def _is_what_was_asked(manifest: Manifest, name: str, tag: str, image: str) -> None:
    """`modelmint publish` writes an artifact only under its own name and its tag or pinned tag; an image under
    any other NAME:TAG is a moved tag (pushed by hand, or by another tool) and would install the wrong model.

    Raises:
        RegistryError: the carried manifest is another name or tag than the one asked for.
    """
    if manifest.name == name and tag in (manifest.tag, pinned_tag(manifest)):
        return
    raise RegistryError(
        f"{image} holds {manifest.ref} (pinned tag {pinned_tag(manifest)}), not {name}:{tag}: the tag was moved "
        "to another artifact's image",
        hint=f"pull {manifest.ref} by its own tag if it is what you want, or publish {name}:{tag} again with "
        f"`modelmint publish {name}:{tag} --registry HOST/NAMESPACE --force` to put the tag back",
    )


def _agrees_with_checkout(settings: Settings, manifest: Manifest, image: str) -> None:
    """When this checkout has the artifact's manifest, the image must carry the same files.

    Raises:
        RegistryError: it carries another registration of the same name:tag.
    """
    try:
        local = find_manifest(settings, manifest.ref)
    except RegistryError:
        return  # no checkout, or this name:tag is not registered in it: the image's own manifest is the record
    if local.files != manifest.files:
        raise RegistryError(
            f"{image} holds another registration of {manifest.ref} ({manifest.file} sha256 {manifest.sha256[:12]}…, "
            f"registered {manifest.created_at:%Y-%m-%d %H:%M}) than this checkout records (sha256 "
            f"{local.sha256[:12]}…, {local.created_at:%Y-%m-%d %H:%M})",
            hint=f"pull this checkout's registration by its pinned tag ({local.name}:{pinned_tag(local)}) if the "
            "registry holds it, or `git pull` to update the checkout",
        )
