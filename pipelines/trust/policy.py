"""The trust policy, registry/trust.yaml: which keys or certificate identities may sign which models, which
Time-Stamp Authorities date their signatures, and unsigned."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from pipelines.core.errors import TrustPolicyInvalid
from pipelines.core.settings import Settings

POLICY_FILE = "trust.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrustedKey(_Strict):
    """One accepted signer: a public key (PEM, EC), or the root certificate(s) a signing certificate's chain must
    lead to with the identity its subject must name."""

    public_key: str | None = Field(default=None, description="PEM public key, relative to registry/")
    ca: str | None = Field(default=None, description="PEM root certificate(s), relative to registry/")
    identity: str | None = Field(
        default=None,
        description="with ca: the signing certificate's subject common name "
        "or one of its subject alternative names (e-mail, URI, DNS)",
    )
    retired: date | None = Field(
        default=None,
        description="signatures timestamped (timestamp_authorities) on or after this day are refused, earlier ones "
        "stay valid; a signature without a trusted timestamp is judged on the day it is verified",
    )
    revoked: date | None = Field(
        default=None,
        description="the day the key was revoked (lost or compromised): from this day on every signature by it is "
        "refused, whatever date it claims or a trusted authority timestamped it at (retired keeps what was "
        "timestamped before)",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> TrustedKey:
        if (self.public_key is None) == (self.ca is None):
            raise ValueError("give exactly one of public_key (a key) or ca (certificates)")
        if self.ca is not None and not self.identity:
            raise ValueError("a certificate signer (ca) needs the identity its certificate must name")
        if self.public_key is not None and self.identity is not None:
            raise ValueError("identity goes with ca (certificates), not with public_key")
        return self

    def retired_at(self, when: datetime) -> bool:
        return self.retired is not None and when.astimezone(UTC).date() >= self.retired


class TimestampAuthority(_Strict):
    """An RFC 3161 Time-Stamp Authority whose timestamps date signatures: the root its certificate chains to."""

    ca: str = Field(description="PEM root certificate(s), relative to registry/")


class ModelRule(_Strict):
    """What is accepted for the models whose name matches a pattern of `models`."""

    keys: list[str] = Field(default_factory=list, description="names from `keys`")
    unsigned: Literal["refuse", "allow"] = "refuse"
    reproductions: StrictInt | None = Field(
        default=None,
        ge=1,
        description="accept a signed artifact only when at least this many reproduced-by attestations "
        "(`modelmint reproduce`) of its files verify, each signed by another key of `keys` than the artifact's "
        "signer and than each other",
    )


class TrustFile(_Strict):
    keys: dict[str, TrustedKey] = Field(default_factory=dict)
    timestamp_authorities: dict[str, TimestampAuthority] = Field(
        default_factory=dict,
        description="name → authority: a signature's RFC 3161 timestamp must chain to one of these roots, and the "
        "keys' retired/revoked days and certificates are judged at its time",
    )
    models: dict[str, ModelRule] = Field(
        min_length=1, description="model name or pattern (`qwen*`, `*`) → rule"
    )


@dataclass(frozen=True)
class Signer:
    """A key of the policy, resolved: its name and the file(s) verification reads."""

    name: str
    key: TrustedKey
    path: Path


@dataclass(frozen=True)
class Rule:
    pattern: str
    signers: tuple[Signer, ...]
    unsigned: Literal["refuse", "allow"]
    reproductions: int = 0
    """How many reproduced-by attestations by other keys of the rule a signed artifact needs (0: none)."""


@dataclass(frozen=True)
class TrustPolicy:
    path: Path
    file: TrustFile
    attestations: Path | None = None
    """The checkout's registry/attestations/, where `modelmint reproduce` keeps reproduced-by attestations (NAME/TAG/
    reproduced-*.json); None: none are read."""

    def rule_for(self, name: str) -> Rule | None:
        """The rule of the most specific pattern matching `name` (the exact name, then the longest pattern)."""
        matching = [p for p in self.file.models if p == name or fnmatch.fnmatchcase(name, p)]
        if not matching:
            return None
        best = max(matching, key=lambda p: (p == name, len(p.replace("*", "").replace("?", ""))))
        rule = self.file.models[best]
        signers = tuple(
            Signer(
                k,
                self.file.keys[k],
                self.path.parent / (self.file.keys[k].public_key or self.file.keys[k].ca or ""),
            )
            for k in rule.keys
        )
        return Rule(best, signers, rule.unsigned, rule.reproductions or 0)

    def timestamp_roots(self) -> list[tuple[str, Path]]:
        """Each Time-Stamp Authority of the policy: (name, its root certificate file)."""
        return [(n, self.path.parent / a.ca) for n, a in self.file.timestamp_authorities.items()]


def policy_path(settings: Settings) -> Path:
    """The file MODELMINT_TRUST names (a policy the people who can change the manifests cannot change), else the
    checkout's registry/trust.yaml."""
    return settings.trust_policy or settings.repo_dir / "registry" / POLICY_FILE


def load_policy(settings: Settings) -> TrustPolicy | None:
    """The trust policy (policy_path), checked; None when the repository has none and MODELMINT_TRUST is unset.

    Raises:
        TrustPolicyInvalid: MODELMINT_TRUST names a file that is not there (never read as "no policy"), not YAML,
            a key given twice (both lines named), an unknown or misspelt key (with its line and the nearest known
            key), a value of the wrong kind (a date that is not one), a rule naming a key `keys` does not define,
            or a key file that is not there.
    """
    path = policy_path(settings)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if settings.trust_policy is not None:
            raise TrustPolicyInvalid(
                f"MODELMINT_TRUST names {path}, which is not there: nothing is verified without the policy",
                hint="point MODELMINT_TRUST at the team's trust policy file, or unset it to use registry/trust.yaml",
            ) from None
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise TrustPolicyInvalid(
            f"{path} cannot be read ({getattr(err, 'strerror', None) or err})",
            hint=f"make {path} readable (docs/trust.md)",
        ) from None
    return TrustPolicy(path, parse_policy(text, path), settings.repo_dir / "registry" / "attestations")


class _Loader(yaml.SafeLoader):
    """YAML's safe loader without its timestamp type: a date stays text for the schema to check with its line
    (yaml's own conversion of `2027-13-01` raises a bare ValueError)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _duplicates(node: yaml.Node | None, where: tuple[str, ...] = ()) -> list[str]:
    """Every key given twice in one mapping, with both lines (YAML keeps the last silently)."""
    found: list[str] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            name = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
            line = k.start_mark.line + 1
            if name in seen:
                found.append(f"lines {seen[name]} and {line} both give {'.'.join((*where, name))} (YAML would "
                             "keep the second silently)")
            else:
                seen[name] = line
            found += _duplicates(v, (*where, name))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            found += _duplicates(v, (*where, str(i)))
    return found


def parse_policy(text: str, path: Path) -> TrustFile:
    """Check the text of a trust policy (see load_policy)."""
    hint = f"fix {path} (docs/trust.md shows its shape)"
    try:
        root = yaml.compose(text, Loader=_Loader)
        raw = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader (no timestamps): no arbitrary objects
    except yaml.YAMLError as err:
        raise TrustPolicyInvalid(f"{path} is not YAML: {err}", hint=hint) from None
    twice = _duplicates(root)
    if twice:
        raise TrustPolicyInvalid(f"{path}: " + "; ".join(twice), hint=hint)
    try:
        policy = TrustFile.model_validate(raw if raw is not None else {})
    except ValidationError as err:
        raise TrustPolicyInvalid(
            f"{path}: " + "; ".join(_describe(e, root) for e in err.errors(include_url=False)), hint=hint
        ) from None
    problems = []
    for pattern, rule in policy.models.items():
        for k in rule.keys:
            if k not in policy.keys:
                close = _close(k, list(policy.keys))
                problems.append(
                    f"line {_line(root, ['models', pattern, 'keys'])}: models.{pattern} names key {k!r}, "
                    "which keys does not define" + (f" (did you mean {close!r}?)" if close else "")
                )
        if rule.reproductions is not None and len(set(rule.keys)) < rule.reproductions + 1:
            problems.append(
                f"line {_line(root, ['models', pattern, 'reproductions'])}: models.{pattern} asks for "
                f"{rule.reproductions} reproduction(s) by keys other than the signer's, but names only "
                f"{len(set(rule.keys))} key(s): no artifact could pass (name at least {rule.reproductions + 1})"
            )
    for name, key in policy.keys.items():
        file = key.public_key or key.ca
        if file and not (path.parent / file).is_file():
            problems.append(
                f"line {_line(root, ['keys', name])}: keys.{name}: {path.parent / file} is not there"
            )
    for name, tsa in policy.timestamp_authorities.items():
        if not (path.parent / tsa.ca).is_file():
            problems.append(
                f"line {_line(root, ['timestamp_authorities', name])}: timestamp_authorities.{name}: "
                f"{path.parent / tsa.ca} is not there"
            )
    if problems:
        raise TrustPolicyInvalid(f"{path}: " + "; ".join(problems), hint=hint)
    return policy


def _close(word: str, known: list[str]) -> str | None:
    from pipelines.source.catalog import did_you_mean

    return did_you_mean(word, known)


_ALLOWED: dict[tuple[str, ...], list[str]] = {
    (): list(TrustFile.model_fields),
    ("keys", "*"): list(TrustedKey.model_fields),
    ("models", "*"): list(ModelRule.model_fields),
    ("timestamp_authorities", "*"): list(TimestampAuthority.model_fields),
}


def _describe(error: Any, root: yaml.Node | None) -> str:
    """One pydantic error as a person reads it: its line, where, and for an unknown key the nearest known one."""
    loc = [str(p) for p in error["loc"]]
    line = _line(root, loc)
    where = f"line {line}: " if line is not None else ""
    if error["type"] == "extra_forbidden" and loc:
        allowed = _ALLOWED.get(() if len(loc) == 1 else (loc[0], "*"), [])
        close = _close(loc[-1], allowed)
        return f"{where}{'.'.join(loc[:-1]) or '(top)'}: unknown key {loc[-1]!r} " + (
            f"(did you mean {close!r}?)" if close else f"(known: {', '.join(allowed)})"
        )
    msg = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}{'.'.join(loc) or '(top)'}: {msg}"


def _line(node: yaml.Node | None, path: list[str]) -> int | None:
    """The 1-based line of the deepest part of `path` that the YAML holds."""
    line = None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            found = next(
                ((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None
            )
            if found is None:
                break
            line, node = found[0].start_mark.line, found[1]
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line
        else:
            break
    return None if line is None else line + 1
