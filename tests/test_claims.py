from kvlab.report.claims import audit, load_claims

STATUSES = {"reproduced", "holds under assumption", "does not hold", "not yet checkable"}
ARTICLES = {"890 bytes per token: how DeepSeek shrinks the KV cache",
            "890 bytes/token: KV-cache math for 1M-token DeepSeek V4.1 Flash"}


def test_every_claim_has_a_status_and_source():
    checks = audit()
    assert len(checks) == len(load_claims()) >= 15
    for c in checks:
        assert c.status in STATUSES
        assert c.source in ARTICLES  # cited by title: a clone has no copy of the articles
        if c.status == "holds under assumption" or c.status == "not yet checkable":
            assert c.note, c.id


def test_key_claims():
    by = {c.id: c for c in audit()}
    assert by["qwen3_8b_bytes_per_token"].status == "reproduced" and by["qwen3_8b_bytes_per_token"].computed == 147456
    assert by["v41_890_bytes"].computed == 890
    assert by["v41_1m_session"].computed == 890_000_000 and by["v41_1m_session"].status == "reproduced"
    assert abs(by["v41_437x_smaller_than_v1"].computed - 437.2) < 0.05
    assert by["v41_437x_vs_7b"].status == "does not hold"
    assert by["v41_quarter_of_v4"].status == "holds under assumption"
    assert by["v41_quarter_vs_v4_bf16"].status == "does not hold"
    assert by["v41_candidate_cap"].computed == 16384
