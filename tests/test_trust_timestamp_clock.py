"""Registration stops, before anything is placed, when the Time-Stamp Authority's clock and this machine's disagree so
that verification would refuse the signature (the signed time after the timestamp, or more than the tolerance before
it): a real `openssl ts` TSA on 127.0.0.1 whose replies are re-dated and re-signed with its own key, as an authority
with a wrong clock would sign them, real git + DVC repositories, real keys."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from asn1crypto import core, tsp
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from registry_env import Repo, candidate
from test_signing import _key
from tsa_server import serve_tsa

from pipelines.core.errors import ModelmintError, TimestampInvalid
from pipelines.registry.register import artifact_dir, register
from pipelines.store.manifest import manifest_path


def _redated(reply: bytes, shift: timedelta, key_pem: Path) -> bytes:
    """`reply` (a granted TimeStampResp) with its genTime moved by `shift`, signed again with the authority's key."""
    resp = tsp.TimeStampResp.load(reply)
    signed = resp["time_stamp_token"]["content"]
    tst = signed["encap_content_info"]["content"].parsed
    tst["gen_time"] = tst["gen_time"].native + shift
    content = tst.dump(force=True)
    signed["encap_content_info"]["content"] = core.ParsableOctetString(content)
    signer = signed["signer_infos"][0]
    for attr in signer["signed_attrs"]:
        if attr["type"].native == "message_digest":
            attr["values"] = [hashlib.sha256(content).digest()]
    key = serialization.load_pem_private_key(key_pem.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    signer["signature"] = key.sign(signer["signed_attrs"].untag().dump(force=True), ec.ECDSA(hashes.SHA256()))
    return resp.dump(force=True)


@contextmanager
def _tsa_off_by(directory: Path, shift: timedelta) -> Iterator[str]:
    """The URL of a TSA on 127.0.0.1 whose clock is `shift` off this machine's."""
    with serve_tsa(directory, answer=lambda reply: _redated(reply, shift, directory / "tsa.key")) as tsa:
        yield tsa.url


@pytest.mark.parametrize(
    ("shift", "said"),
    [
        (timedelta(hours=-1), "the written time is after the timestamp"),
        (timedelta(hours=1), "the written time is more than 10 minutes before the timestamp"),
    ],
    ids=["authority-behind", "authority-ahead"],
)
def test_registration_stops_when_the_authoritys_clock_and_this_machines_disagree(
    repo: Repo, tmp_path: Path, shift: timedelta, said: str
) -> None:
    private, _ = _key(tmp_path / "signing.pem")
    with _tsa_off_by(tmp_path / "tsa", shift) as url:
        settings = repo.settings(MODELMINT_SIGNING_KEY=private, MODELMINT_TSA_URL=url)
        c = candidate(settings, tmp_path / "build")
        with pytest.raises(TimestampInvalid) as err:
            register(settings, c)
    assert isinstance(err.value, ModelmintError) and not err.value.transient
    assert "this machine's clock says it signed at 20" in err.value.message
    assert f"the Time-Stamp Authority {url} timestamped the signature at 20" in err.value.message
    assert said in err.value.message and "nothing was registered" in err.value.message
    assert err.value.hint is not None and "clock" in err.value.hint
    # nothing placed, nothing recorded
    placed = artifact_dir(settings, "tiny-qwen2", "q4_k_m")
    assert not placed.exists() and not manifest_path(settings, "tiny-qwen2", "q4_k_m").exists()
    assert sorted(p.name for p in placed.parent.glob("q4_k_m*")) == []  # no partial directory either
