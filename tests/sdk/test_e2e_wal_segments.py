"""A segmented WAL, shipped and compacted, against the REAL control plane (audit ingest, saga
projection): the WAL_CHAIN_GAP attestations are verified and stored like any record, the server
holds every record the agent ever wrote once, and a shipper that forgot its cursor resumes from
the server's head in what is left of the WAL, or at the trim mark when the head record was removed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sagaplane as sp
from sagaplane.chain import GAP_EVENT, attested_ranges, verify_chain
from sagaplane.cli import main as cli_main
from sagaplane.segments import complete_end, load_manifest
from test_e2e_ship import fast_shipper, run_sagas, saga_of, stream_of
from test_sdk_wal_segments import files_match_manifest, records_of

from audit.models import Record
from core.scoping import tenant_context


def test_a_shipped_and_compacted_wal_ingests_cleanly(
    transactional_db: None, live_server: Any, alice: Any, tmp_path: Path
) -> None:
    path = tmp_path / "agent.wal"
    wal = sp.WAL(path, segment_bytes=4096)
    shipper = fast_shipper(wal, live_server.url, alice.api_key, batch_size=16)
    shipper.on_acknowledged(wal.acknowledge)
    ids: dict[str, str] = {}
    try:
        for round_ in range(6):
            ids.update({f"{k}-{round_}": v for k, v in run_sagas(wal, tag=f"seg{round_}").items()})
            assert shipper.flush(60), shipper.failure
        assert wal.rolls >= 3 and wal.removed_segments >= 2
    finally:
        shipper.close()
    try:
        # Each acknowledgement may chain an attestation, and one may come after any flush. Once
        # the acknowledging shipper is closed nothing more is chained: ship what it left.
        tail = fast_shipper(wal, live_server.url, alice.api_key, batch_size=16)
        try:
            assert tail.flush(60), tail.failure
        finally:
            tail.close()
        written = wal.seq
    finally:
        wal.close()
    files_match_manifest(path)
    kept = records_of(path)
    assert kept[0]["seq"] > 1 and verify_chain(kept).intact  # what is left verifies on its own
    assert cli_main(["verify-wal", str(path)]) == 0

    client = sp.Client(live_server.url, alice.api_key)
    stream = stream_of(client, wal.stream_id)
    # The server holds every record ever written, attestations included, once.
    assert stream["length"] == written and stream["head"] == {"seq": kept[-1]["seq"], "hash": kept[-1]["_h"]}
    with tenant_context(alice.tenant):
        held = set(
            Record.objects.filter(stream__stream_id=wal.stream_id, event=GAP_EVENT).values_list(
                "h", flat=True
            )
        )
    local = [r for r in kept if r["event"] == GAP_EVENT]
    assert local and {r["_h"] for r in local} <= held  # verified and stored like any record
    assert attested_ranges(kept).missing(1, kept[0]["seq"]) == (0, [])  # every seq that left, named
    for key, saga_id in ids.items():
        assert saga_of(client, saga_id)["saga"]["status"] == key.rsplit("-", 1)[0]

    # A shipper that lost its cursor finds the server's head in what is left and sends nothing.
    shipper.cursor_file.unlink()
    again = sp.Shipper(path, url=live_server.url, api_key=alice.api_key)
    assert again.run_until_caught_up() == 0 and again.cursor.offset == complete_end(path)
    assert again.accepted == 0 and again.duplicates == 0


def test_a_shipper_resumes_at_the_trim_mark_when_removal_took_the_head_record(
    transactional_db: None, live_server: Any, alice: Any, tmp_path: Path
) -> None:
    path = tmp_path / "agent.wal"
    with sp.WAL(path, segment_bytes=2048) as wal:
        run_sagas(wal, tag="trim")
        wal.flush()
        shipper = sp.Shipper(path, stream_id=wal.stream_id, url=live_server.url, api_key=alice.api_key)
        shipper.run_until_caught_up()
        # Everything is acknowledged; seal the live segment so its last record can leave too.
        wal.segment_bytes = 1
        wal.append("NOTE", {"sealed": True})
        wal.segment_bytes = 2048
        shipper.run_until_caught_up()
        shipper.close()
        assert wal.acknowledge(shipper.cursor.offset) >= 1
    manifest = load_manifest(path)
    assert manifest is not None and manifest.trimmed is not None
    # Pretend the process died before shipping the attestation, with its cursor lost: the server's
    # head is the last removed record, which only the trim mark still names.
    shipper.cursor_file.unlink()
    head = stream_of(sp.Client(live_server.url, alice.api_key), wal.stream_id)["head"]
    assert head["hash"] == manifest.trimmed["hash"]
    again = sp.Shipper(path, url=live_server.url, api_key=alice.api_key)
    shipped = again.run_until_caught_up()
    assert shipped == len(records_of(path)) and again.accepted == shipped  # the attestation and after
    assert (
        stream_of(sp.Client(live_server.url, alice.api_key), wal.stream_id)["head"]["hash"]
        == (records_of(path)[-1]["_h"])
    )
