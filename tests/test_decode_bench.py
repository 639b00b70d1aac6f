"""`spectral-jax bench decode`: the table, JSON and plot, and state sizes that are constant in
the context length for the O(1) states and grow with it for the softmax KV cache."""

from __future__ import annotations

import json

from PIL import Image

from spectral_jax.lra import cli


def test_bench_decode_writes_ratios_to_softmax_and_state_sizes(tmp_path, capsys):
    out = tmp_path / "decode"
    rc = cli.main(["bench", "decode", "--methods", "linear", "performer", "gated_linear",
                   "local", "--lengths", "64", "256", "--steps", "2", "--repeats", "1",
                   "--head-dim", "8", "--out", str(out)])
    assert rc == 0
    payload = json.loads((tmp_path / "decode.json").read_text())
    recs = {(r["method"], r["context"]): r for r in payload["records"]}
    assert set(recs) == {(m, n) for m in ("softmax", "linear", "performer", "gated_linear",
                                          "local") for n in (64, 256)}
    assert all(r["time_per_token_s"] > 0 for r in recs.values())
    assert recs[("softmax", 256)]["time_ratio"] == 1.0
    # Sizes are exact: softmax keeps K and V of every slot (n + steps, head_dim 8, float32);
    # linear and RFA-Gate a d x d state and a d normaliser; performer its default 256
    # features (r x d, r, and one stabiliser); local window 32: 33 slots of K and V.
    for n in (64, 256):
        assert recs[("softmax", n)]["state_bytes"] == 2 * (n + 2) * 8 * 4
        assert recs[("linear", n)]["state_bytes"] == (8 * 8 + 8) * 4
        assert recs[("gated_linear", n)]["state_bytes"] == (8 * 8 + 8) * 4
        assert recs[("performer", n)]["state_bytes"] == (256 * 8 + 256 + 1) * 4
        assert recs[("local", n)]["state_bytes"] == 2 * 33 * 8 * 4
    assert recs[("linear", 256)]["bytes_ratio"] == (8 * 8 + 8) / (2 * 258 * 8)
    assert payload["config"]["steps"] == 2
    assert Image.open(tmp_path / "decode.png").size[0] > 500
    text = capsys.readouterr().out
    assert "× softmax" in text and "ring_buffer" in text
