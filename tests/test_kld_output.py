"""What `llama-perplexity --kl-divergence` prints, as validation reads it: outputs of the pinned llama.cpp
(tests/data/llama_perplexity_kld_*.txt: stdout, then stderr, as the runner hands them over)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.core.errors import ArtifactError, ToolStoppedShort
from pipelines.gguf.validate import kld_stopped_short, parse_kld_output

DATA = Path(__file__).parent / "data"


def test_a_complete_output_is_parsed() -> None:
    text = (DATA / "llama_perplexity_kld_full.txt").read_text()
    assert kld_stopped_short(text) is None
    stats = parse_kld_output(text, 128)
    assert stats.chunks == 16 and stats.mean_kld == pytest.approx(0.001271)


def test_an_output_that_stops_before_its_last_chunk_is_a_transient_error() -> None:
    # one flow run under load: 15 of 16 rows, no statistics, no error line, exit 0 (was "printed no mean KLD",
    # a verdict-like error the flow never retried)
    text = (DATA / "llama_perplexity_kld_cut.txt").read_text()
    assert kld_stopped_short(text) == (15, 16)
    assert issubclass(ToolStoppedShort, ArtifactError) and ToolStoppedShort("x").transient
    with pytest.raises(ArtifactError, match="printed no mean KLD"):
        parse_kld_output(text, 128)
